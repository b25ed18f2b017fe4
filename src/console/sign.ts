// Served as /console/sign.js: the browser-safe signing helper as a plain ES
// module, for pages without a bundler (README, "Calling from a browser").
export { canonicalString, deriveSigningKey, newNonce, signatureFields, signatureScheme, signCall, type SignedCall } from "../client/browser-signature.ts";
