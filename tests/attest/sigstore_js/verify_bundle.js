// Independent check of a Sigstore bundle with a public key (sigstore-js), offline: the key is
// found by the hint computed here (base64 of the sha256 of its DER SubjectPublicKeyInfo), with
// no transparency log, SCT or timestamp required. Usage: node verify_bundle.js BUNDLE PUB.pem
const fs = require("fs");
const crypto = require("crypto");
const { bundleFromJSON } = require("@sigstore/bundle");
const { Verifier, toSignedEntity, toTrustMaterial } = require("@sigstore/verify");
const [bundlePath, pubPath] = process.argv.slice(2);
const bundle = bundleFromJSON(JSON.parse(fs.readFileSync(bundlePath, "utf8")));
const der = crypto.createPublicKey(fs.readFileSync(pubPath)).export({ type: "spki", format: "der" });
const hint = crypto.createHash("sha256").update(der).digest("base64");
const root = { certificateAuthorities: [], timestampAuthorities: [], tlogs: [], ctlogs: [] };
const trust = toTrustMaterial(root, { [hint]: { rawBytes: der } });
const verifier = new Verifier(trust, { tlogThreshold: 0, ctlogThreshold: 0, timestampThreshold: 0 });
try {
  verifier.verify(toSignedEntity(bundle));
  console.log("VERIFIED " + bundle.mediaType);
} catch (e) {
  console.log("FAILED " + e.code + " " + e.message);
  process.exit(1);
}
