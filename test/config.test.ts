import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { ConfigError, defaultConfig, loadConfig } from "../src/config.ts";

const dir = mkdtempSync(join(tmpdir(), "gateway-config-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

function file(name: string, content: unknown): string {
  const path = join(dir, name);
  writeFileSync(path, typeof content === "string" ? content : JSON.stringify(content));
  return path;
}

describe("configuration", () => {
  it("defaults to 127.0.0.1:8080 and ./data", () => {
    const c = loadConfig({});
    expect([c.host, c.port, c.timeZone, c.zoneLabel]).toEqual(["127.0.0.1", 8080, "Asia/Shanghai", "Beijing"]);
    expect(c.dataDir).toBe(join(process.cwd(), "data"));
  });

  it("reads a JSON file, and environment variables win over it", () => {
    const path = file("ok.json", { port: 9000, host: "0.0.0.0", nodeLabel: "gw-7" });
    const c = loadConfig({ GATEWAY_CONFIG: path, GATEWAY_PORT: "9100" });
    expect([c.host, c.port, c.nodeLabel]).toEqual(["0.0.0.0", 9100, "gw-7"]);
  });

  it("names every bad value at once, and what it accepts", () => {
    const path = file("bad.json", { colour: "blue", maxBodyBytes: 12 });
    let error: unknown;
    try {
      loadConfig({ GATEWAY_CONFIG: path, GATEWAY_PORT: "http", GATEWAY_TIME_ZONE: "Asia/Atlantis", GATEWAY_LOG_LEVEL: "loud", GATEWAY_TLS_CERT: "/x.pem" });
    } catch (e) {
      error = e;
    }
    expect(error).toBeInstanceOf(ConfigError);
    const message = (error as Error).message;
    for (const part of ['unknown setting "colour"', "GATEWAY_MAX_BODY_BYTES", "GATEWAY_PORT", "GATEWAY_TIME_ZONE", "GATEWAY_LOG_LEVEL", "set together"]) {
      expect(message).toContain(part);
    }
  });

  it("reports a config file that is not JSON", () => {
    expect(() => loadConfig({ GATEWAY_CONFIG: file("broken.json", "{port:") })).toThrow(/GATEWAY_CONFIG=.*broken\.json/);
    expect(() => loadConfig({ GATEWAY_CONFIG: join(dir, "missing.json") })).toThrow(ConfigError);
  });

  it("keeps the defaults object the single place defaults live", () => {
    expect(loadConfig({ GATEWAY_DATA_DIR: "/srv/gw" })).toEqual({ ...defaultConfig, dataDir: "/srv/gw" });
  });
});
