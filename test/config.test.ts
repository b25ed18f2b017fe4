import { copyFileSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { readFileSync } from "node:fs";
import { ConfigError, defaultConfig, loadConfig, settings } from "../src/config.ts";
import { otlpHeaderList, otlpPlan } from "../src/exporters/otlp-plan.ts";
import { makeCertificate } from "./support/certificates.ts";
import { defaultCachePolicy } from "../src/core/cached-catalogue.ts";
import { defaultUpstreamOptions } from "../src/sources/upstream/upstream-source.ts";
import { defaultMeterOptions } from "../src/stores/embedded/meter.ts";
import { defaultAppSettings } from "../src/transports/server/app.ts";
import { withSettingsTable } from "../scripts/docs.ts";
import { startGateway } from "./support/gateway-fixture.ts";

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

  it("takes each default from the component that owns it, so the two cannot disagree", () => {
    expect(defaultConfig.ledgerCommitMs).toBe(defaultMeterOptions.commitIntervalMs);
    expect(defaultConfig.minFreeMb * 1_048_576).toBe(defaultMeterOptions.minFreeBytes);
    expect(defaultConfig.upstreamTimeoutMs).toBe(defaultUpstreamOptions.attemptTimeoutMs);
    expect(defaultConfig.upstreamConnections).toBe(defaultUpstreamOptions.connections);
    expect(defaultConfig.cacheNotFoundTtlSeconds).toBe(defaultCachePolicy.notFoundTtlSeconds);
    expect(defaultConfig.maxHeaderBytes).toBe(defaultAppSettings.limits.maxHeaderBytes);
    expect(defaultConfig.maxBodyBytes).toBe(defaultAppSettings.maxBodyBytes);
    const names = Object.values(settings).map((s) => s.env);
    expect(new Set(names).size).toBe(names.length);
    for (const name of names) expect(name).toMatch(/^GATEWAY_[A-Z0-9_]+$/);
  });

  it("the README's settings table is the one generated from the rows (npm run docs)", () => {
    const readme = readFileSync(join(import.meta.dirname, "..", "README.md"), "utf8");
    expect(readme).toBe(withSettingsTable(readme));
    for (const s of Object.values(settings)) expect(readme).toContain(`\`${s.env}\``);
  });

  it("the app the tests build is the one serve builds from the same configuration", async () => {
    const gw = await startGateway({ config: { maxHeaderBytes: 2048, corsOrigins: "https://shop.example.com", maxBodyBytes: 2048 } });
    try {
      const big = await fetch(`${gw.base}/retail/item_get/`, { headers: { "x-padding": "a".repeat(3000) } });
      expect(big.status).toBe(431);
      const allowed = await gw.app.inject({ method: "OPTIONS", url: "/retail/item_get/", headers: { origin: "https://shop.example.com", "access-control-request-method": "GET" } });
      expect(allowed.headers["access-control-allow-origin"]).toBe("https://shop.example.com");
      const other = await gw.app.inject({ method: "OPTIONS", url: "/retail/item_get/", headers: { origin: "https://evil.example.com", "access-control-request-method": "GET" } });
      expect(other.headers["access-control-allow-origin"]).toBeUndefined();
      const body = await gw.app.inject({ method: "POST", url: "/retail/item_get/", headers: { "content-type": "application/json" }, payload: JSON.stringify({ pad: "x".repeat(4000) }) });
      expect(JSON.parse(body.body).reason).toContain("larger than 2048 bytes");
    } finally {
      await gw.close();
    }
  });

  it("shared mode needs both stores, and names the one that is missing", () => {
    expect(() => loadConfig({ GATEWAY_DATABASE_URL: "postgres://postgres@127.0.0.1:5432/gw" })).toThrow(/GATEWAY_REDIS_URL is not set/);
    expect(() => loadConfig({ GATEWAY_REDIS_URL: "redis://127.0.0.1:6379" })).toThrow(/GATEWAY_DATABASE_URL is not set/);
    expect(() => loadConfig({ GATEWAY_DATABASE_URL: "mysql://x", GATEWAY_REDIS_URL: "redis://127.0.0.1:6379" })).toThrow(/must be a postgres:\/\/ URL/);
    const c = loadConfig({ GATEWAY_DATABASE_URL: "postgres://postgres@127.0.0.1:5432/gw", GATEWAY_REDIS_URL: "redis://127.0.0.1:6379", GATEWAY_NODE_LABEL: "old-name" });
    expect([c.databaseUrl, c.redisUrl, c.nodeLabel]).toEqual(["postgres://postgres@127.0.0.1:5432/gw", "redis://127.0.0.1:6379", "old-name"]);
    expect(loadConfig({ GATEWAY_NODE_ID: "gw-7", GATEWAY_NODE_LABEL: "old-name" }).nodeLabel).toBe("gw-7");
  });

  it("reads OpenTelemetry's own names for the traces endpoint and the service, and refuses an endpoint that is not a URL", () => {
    const c = loadConfig({ OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: "http://127.0.0.1:4318/v1/traces", OTEL_SERVICE_NAME: "shop-gateway" });
    expect([c.otlpTracesUrl, c.serviceName, c.traceSamplePerMille]).toEqual(["http://127.0.0.1:4318/v1/traces", "shop-gateway", 0]);
    expect(loadConfig({ GATEWAY_OTLP_TRACES_URL: "http://a:4318/v1/traces", OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: "http://b:4318/v1/traces" }).otlpTracesUrl).toBe("http://a:4318/v1/traces");
    expect(() => loadConfig({ GATEWAY_OTLP_TRACES_URL: "collector:4318" })).toThrow(/otlpTracesUrl.* must be an http or https URL/);
    expect(() => loadConfig({ GATEWAY_TRACE_SAMPLE_PER_MILLE: "1001" })).toThrow(/GATEWAY_TRACE_SAMPLE_PER_MILLE/);
    // The collector's headers, in OpenTelemetry's form; the signal's own name before the general one.
    expect(otlpHeaderList(loadConfig({ OTEL_EXPORTER_OTLP_HEADERS: "Authorization=Bearer%20abc,x-a=1%2C2" }))).toEqual({ authorization: "Bearer abc", "x-a": "1,2" });
    expect(otlpHeaderList(loadConfig({ OTEL_EXPORTER_OTLP_HEADERS: "x-a=general", OTEL_EXPORTER_OTLP_TRACES_HEADERS: "x-a=traces" }))).toEqual({ "x-a": "traces" });
    expect(otlpHeaderList(loadConfig({}))).toEqual({});
    // A value that cannot be read is refused without being repeated: it is a credential.
    for (const bad of ["authorization Bearer hunter2-secret", "=hunter2-secret", "bad name=hunter2-secret", "x=%E0%A4%A-hunter2-secret"]) {
      let message = "";
      try {
        loadConfig({ GATEWAY_OTLP_HEADERS: bad });
      } catch (e) {
        message = (e as Error).message;
      }
      expect(message, bad).toMatch(/otlpHeaders.* must be name=value pairs/);
      expect(message).not.toContain("hunter2");
    }
  });

  it("reads OpenTelemetry's exporter settings as its SDKs do: the base endpoint, the protocol, compression, the limit, the resource, and none", () => {
    const plan = (env: NodeJS.ProcessEnv) => otlpPlan(loadConfig(env)).plan;
    // No endpoint: no spans; OpenTelemetry's binary OTLP/HTTP otherwise, 10 s a request.
    expect(plan({})).toBeUndefined();
    expect(plan({ OTEL_EXPORTER_OTLP_ENDPOINT: "http://collector:4318" })).toMatchObject({ url: "http://collector:4318/v1/traces", protocol: "http/protobuf", gzip: false, timeoutMs: 10_000 });
    expect(plan({ OTEL_EXPORTER_OTLP_ENDPOINT: "https://otlp.example.com/tenant-a/" })?.url).toBe("https://otlp.example.com/tenant-a/v1/traces");
    // The signal's own endpoint is used as written, and before the base one; gRPC takes the base one as written.
    expect(plan({ OTEL_EXPORTER_OTLP_ENDPOINT: "http://a:4318", OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: "http://b:4318/custom" })?.url).toBe("http://b:4318/custom");
    expect(plan({ OTEL_EXPORTER_OTLP_ENDPOINT: "http://collector:4317", OTEL_EXPORTER_OTLP_PROTOCOL: "grpc" })).toMatchObject({ url: "http://collector:4317", protocol: "grpc" });
    // The signal's own settings before the general ones; the gateway's own names before both.
    const c = { OTEL_EXPORTER_OTLP_ENDPOINT: "http://c:4318", OTEL_EXPORTER_OTLP_PROTOCOL: "grpc", OTEL_EXPORTER_OTLP_TRACES_PROTOCOL: "http/json", OTEL_EXPORTER_OTLP_COMPRESSION: "gzip", OTEL_EXPORTER_OTLP_TIMEOUT: "2500", OTEL_EXPORTER_OTLP_TRACES_TIMEOUT: "1500" };
    expect(plan(c)).toMatchObject({ protocol: "http/json", gzip: true, timeoutMs: 1500 });
    expect(plan({ ...c, GATEWAY_OTLP_PROTOCOL: "http/protobuf", GATEWAY_OTLP_TIMEOUT_MS: "700" })).toMatchObject({ protocol: "http/protobuf", timeoutMs: 700 });
    expect(() => loadConfig({ OTEL_EXPORTER_OTLP_PROTOCOL: "thrift" })).toThrow(/GATEWAY_OTLP_PROTOCOL \(otlpProtocol\) must be one of http\/protobuf, http\/json, grpc, not "thrift"/);
    expect(() => loadConfig({ OTEL_EXPORTER_OTLP_ENDPOINT: "collector:4318" })).toThrow(/GATEWAY_OTLP_ENDPOINT \(otlpEndpoint\) must be an http or https URL/);
    // `none` turns the spans off whatever endpoint is set; a list naming otlp is otlp; another exporter is refused.
    expect(plan({ OTEL_EXPORTER_OTLP_ENDPOINT: "http://c:4318", OTEL_TRACES_EXPORTER: "none" })).toBeUndefined();
    expect(plan({ OTEL_EXPORTER_OTLP_ENDPOINT: "http://c:4318", OTEL_TRACES_EXPORTER: "otlp,console" })).toBeDefined();
    expect(() => loadConfig({ OTEL_TRACES_EXPORTER: "zipkin" })).toThrow(/tracesExporter\) must be otlp or none/);
    // The resource: OpenTelemetry's form; service.name from it unless the gateway's own setting names one.
    expect(plan({ OTEL_EXPORTER_OTLP_ENDPOINT: "http://c:4318", OTEL_RESOURCE_ATTRIBUTES: "service.name=from-resource,deployment.environment.name=prod,k8s.pod.name=gw%2C0" })).toMatchObject({
      serviceName: "from-resource",
      resource: { "service.name": "from-resource", "deployment.environment.name": "prod", "k8s.pod.name": "gw,0" },
    });
    expect(plan({ OTEL_EXPORTER_OTLP_ENDPOINT: "http://c:4318", OTEL_RESOURCE_ATTRIBUTES: "service.name=from-resource", OTEL_SERVICE_NAME: "named" })?.serviceName).toBe("named");
    expect(() => loadConfig({ OTEL_RESOURCE_ATTRIBUTES: "no-equals-sign" })).toThrow(/resourceAttributes\) must be key=value pairs/);
  });

  it("reads OpenTelemetry's parent-based samplers for the calls without a traceparent, and refuses one that would not follow the caller", () => {
    const plan = (env: NodeJS.ProcessEnv) => otlpPlan(loadConfig({ OTEL_EXPORTER_OTLP_ENDPOINT: "http://c:4318", ...env })).plan;
    expect(plan({})?.rootRatio).toBe(0);
    expect(plan({ GATEWAY_TRACE_SAMPLE_PER_MILLE: "25" })?.rootRatio).toBe(0.025);
    expect(plan({ OTEL_TRACES_SAMPLER: "parentbased_always_on", GATEWAY_TRACE_SAMPLE_PER_MILLE: "25" })?.rootRatio).toBe(1);
    expect(plan({ OTEL_TRACES_SAMPLER: "parentbased_always_off" })?.rootRatio).toBe(0);
    expect(plan({ OTEL_TRACES_SAMPLER: "parentbased_traceidratio", OTEL_TRACES_SAMPLER_ARG: "0.0005" })?.rootRatio).toBe(0.0005);
    // OpenTelemetry's default share is 1.0.
    expect(plan({ OTEL_TRACES_SAMPLER: "parentbased_traceidratio" })?.rootRatio).toBe(1);
    // always_off records nothing, not even a sampled caller's calls.
    expect(plan({ OTEL_TRACES_SAMPLER: "always_off" })).toBeUndefined();
    expect(() => loadConfig({ OTEL_TRACES_SAMPLER: "parentbased_traceidratio", OTEL_TRACES_SAMPLER_ARG: "1.5" })).toThrow(/tracesSamplerArg\) must be a share from 0 to 1, not "1.5"/);
    expect(() => loadConfig({ OTEL_TRACES_SAMPLER: "always_on" })).toThrow(/tracesSampler\) must be parentbased_always_on, parentbased_always_off, parentbased_traceidratio or always_off/);
  });

  it("reads the TLS files for an https collector at the start, refusing a missing one or a half pair without showing a key", () => {
    const dir = mkdtempSync(join(tmpdir(), "otlp-config-"));
    try {
      // Real ones: the start checks that they work together (as the gateway's own certificate and key).
      makeCertificate(dir, "one");
      makeCertificate(dir, "two");
      copyFileSync(join(dir, "one.cert.pem"), join(dir, "ca.pem"));
      copyFileSync(join(dir, "one.key.pem"), join(dir, "key.pem"));
      writeFileSync(join(dir, "junk.pem"), "hunter2-not-pem");
      const base = { OTEL_EXPORTER_OTLP_ENDPOINT: "https://c:4318" };
      const p = otlpPlan(loadConfig({ ...base, OTEL_EXPORTER_OTLP_CERTIFICATE: join(dir, "ca.pem"), OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE: join(dir, "ca.pem"), OTEL_EXPORTER_OTLP_CLIENT_KEY: join(dir, "key.pem") })).plan;
      expect(p?.tls.ca).toContain("BEGIN CERTIFICATE");
      expect(p?.tls.key).toContain("BEGIN PRIVATE KEY");
      const problem = (env: NodeJS.ProcessEnv) => {
        try {
          loadConfig({ ...base, ...env });
          return "";
        } catch (e) {
          return (e as Error).message;
        }
      };
      expect(problem({ GATEWAY_OTLP_CERTIFICATE: join(dir, "missing.pem") })).toMatch(/GATEWAY_OTLP_CERTIFICATE \(otlpCertificate\): .*missing\.pem cannot be read as PEM: ENOENT/);
      const junk = problem({ GATEWAY_OTLP_CLIENT_CERTIFICATE: join(dir, "ca.pem"), GATEWAY_OTLP_CLIENT_KEY: join(dir, "junk.pem") });
      expect(junk).toMatch(/GATEWAY_OTLP_CLIENT_KEY \(otlpClientKey\): .*junk\.pem cannot be read as PEM: it holds no PEM block/);
      expect(junk).not.toContain("hunter2");
      expect(problem({ GATEWAY_OTLP_CLIENT_KEY: join(dir, "key.pem") })).toMatch(/GATEWAY_OTLP_CLIENT_CERTIFICATE and GATEWAY_OTLP_CLIENT_KEY must be set together/);
      // A key that is not the certificate's: refused at the start, as OpenSSL words it, quoting neither.
      const mismatch = problem({ GATEWAY_OTLP_CLIENT_CERTIFICATE: join(dir, "ca.pem"), GATEWAY_OTLP_CLIENT_KEY: join(dir, "two.key.pem") });
      expect(mismatch).toMatch(/the collector's TLS files .* cannot be used together: key values mismatch/);
      expect(mismatch).not.toContain(readFileSync(join(dir, "two.key.pem"), "utf8").split("\n")[1]!);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
