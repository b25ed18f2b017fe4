import { execFileSync } from "node:child_process";
import { copyFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";

/**
 * Self-signed certificates for 127.0.0.1 made with the system's `openssl`,
 * as `<name>.cert.pem` and `<name>.key.pem` in `dir`.
 */
export function makeCertificate(dir: string, name: string, days = 30): void {
  execFileSync("openssl", [
    "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", String(days), "-subj", `/CN=gateway-${name}`,
    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", join(dir, `${name}.key.pem`), "-out", join(dir, `${name}.cert.pem`),
  ], { stdio: "ignore" });
}

/**
 * One valid from two days ago to yesterday, with the key of `keyOf` (made
 * before): OpenSSL 3.0's `req` cannot date a certificate back; its `ca` can.
 */
export function makeExpiredCertificate(dir: string, name: string, keyOf: string): void {
  const stamp = (msAgo: number) => new Date(Date.now() - msAgo).toISOString().replace(/[-:T]/g, "").replace(/\.\d+/, "");
  writeFileSync(join(dir, "ca.cnf"), "[ca]\ndefault_ca = d\n[d]\ndatabase = index.txt\nnew_certs_dir = .\ndefault_md = sha256\npolicy = p\nserial = serial\n[p]\ncommonName = supplied\n");
  writeFileSync(join(dir, "index.txt"), "");
  writeFileSync(join(dir, "serial"), "01\n");
  copyFileSync(join(dir, `${keyOf}.key.pem`), join(dir, `${name}.key.pem`));
  execFileSync("openssl", ["req", "-new", "-key", `${name}.key.pem`, "-subj", `/CN=gateway-${name}`, "-out", `${name}.csr`], { cwd: dir, stdio: "ignore" });
  execFileSync("openssl", [
    "ca", "-batch", "-notext", "-config", "ca.cnf", "-selfsign", "-keyfile", `${name}.key.pem`, "-in", `${name}.csr`,
    "-startdate", stamp(2 * 86_400_000), "-enddate", stamp(86_400_000), "-out", `${name}.cert.pem`,
  ], { cwd: dir, stdio: "ignore" });
}
