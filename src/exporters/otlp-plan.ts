import { readFileSync } from "node:fs";
import { createSecureContext } from "node:tls";
import type { GatewayConfig } from "../config.ts";
import { reasonOf } from "../transports/server/tls-certificate.ts";

/** The protocols OpenTelemetry's exporters speak (`OTEL_EXPORTER_OTLP_PROTOCOL`). */
export const otlpProtocols = ["http/protobuf", "http/json", "grpc"] as const;
export type OtlpProtocol = (typeof otlpProtocols)[number];

type OtlpSettings = Pick<
  GatewayConfig,
  | "otlpTracesUrl"
  | "otlpEndpoint"
  | "otlpProtocol"
  | "otlpCompression"
  | "otlpTimeoutMs"
  | "otlpHeaders"
  | "otlpCertificate"
  | "otlpClientCertificate"
  | "otlpClientKey"
  | "tracesExporter"
  | "resourceAttributes"
  | "serviceName"
  | "traceSamplePerMille"
  | "tracesSampler"
  | "tracesSamplerArg"
>;

/** Where and how the gateway's spans are sent, read from the settings once. */
export interface OtlpPlan {
  readonly url: string;
  readonly protocol: OtlpProtocol;
  readonly gzip: boolean;
  readonly timeoutMs: number;
  /** Credentials, possibly: never logged. */
  readonly headers: Readonly<Record<string, string>>;
  /** PEM text for an `https` collector: the authorities to trust, and the gateway's own certificate and key (mutual TLS). */
  readonly tls: { readonly ca?: string; readonly cert?: string; readonly key?: string };
  /** The files that PEM text was read from, read again for a renewal. */
  readonly tlsFiles: { readonly ca?: string; readonly cert?: string; readonly key?: string };
  /** The resource's attributes from `GATEWAY_RESOURCE_ATTRIBUTES`, and `service.name` as the settings decide it. */
  readonly resource: Readonly<Record<string, string>>;
  readonly serviceName: string;
  /** Of the calls that send no `traceparent`, the share recorded, each as a trace of its own (0 to 1). */
  readonly rootRatio: number;
}

/**
 * `name=value` pairs, comma-separated, each side percent-encoded: how
 * OpenTelemetry writes `OTEL_EXPORTER_OTLP_HEADERS` and
 * `OTEL_RESOURCE_ATTRIBUTES`. Undefined where the text is not that.
 */
function percentPairs(text: string, validName: (name: string) => boolean, lowerNames: boolean): Record<string, string> | undefined {
  const out: Record<string, string> = {};
  for (const part of text.split(",")) {
    if (part.trim() === "") continue;
    const eq = part.indexOf("=");
    if (eq <= 0) return undefined;
    try {
      const raw = decodeURIComponent(part.slice(0, eq).trim());
      const name = lowerNames ? raw.toLowerCase() : raw;
      const value = decodeURIComponent(part.slice(eq + 1).trim());
      if (!validName(name) || /[\r\n\0]/.test(value)) return undefined;
      out[name] = value;
    } catch {
      return undefined;
    }
  }
  return out;
}

/** `GATEWAY_OTLP_HEADERS` as header fields, or undefined where it cannot be read as OpenTelemetry's form. */
export function otlpHeaderList(config: Pick<GatewayConfig, "otlpHeaders">): Record<string, string> | undefined {
  return percentPairs(config.otlpHeaders, (name) => /^[!#$%&'*+.^_`|~0-9a-z-]+$/.test(name), true);
}

/** `GATEWAY_RESOURCE_ATTRIBUTES` as attributes, or undefined where it cannot be read. */
export function resourceAttributeList(config: Pick<GatewayConfig, "resourceAttributes">): Record<string, string> | undefined {
  return percentPairs(config.resourceAttributes, (name) => name.length <= 255 && !/[\0-\x1f]/.test(name), false);
}

/** The collector's TLS parts as PEM text (or, as `tlsFiles`, the files they are read from). */
export interface TlsParts {
  ca?: string;
  cert?: string;
  key?: string;
}

/**
 * Reads the collector's TLS files, at start and at each renewal: their PEM
 * text, or the first that cannot be read as PEM and why, in words that quote
 * none of its bytes.
 */
export function readTlsFiles(files: Readonly<TlsParts>, read: (file: string) => string): { tls: TlsParts } | { part: keyof TlsParts; problem: string } {
  const tls: TlsParts = {};
  for (const part of ["ca", "cert", "key"] as const) {
    const file = files[part];
    if (file === undefined) continue;
    let pem: string;
    try {
      pem = read(file);
    } catch (e) {
      return { part, problem: reasonOf(e) };
    }
    if (!/-----BEGIN [A-Z0-9 ]+-----/.test(pem)) return { part, problem: "it holds no PEM block" };
    tls[part] = pem;
  }
  return { tls };
}

/** Why TLS parts cannot be used together (a key that is not the certificate's, say), as OpenSSL says it and quoting none of them; undefined where they can. */
export function tlsProblem(tls: Readonly<TlsParts>): string | undefined {
  try {
    createSecureContext(tls);
    return undefined;
  } catch (e) {
    return reasonOf(e);
  }
}

/** `none`, or a list that names `otlp`: whether spans are wanted; undefined for anything else. */
function exporterWanted(value: string): boolean | undefined {
  const names = value.split(",").map((n) => n.trim().toLowerCase()).filter((n) => n !== "");
  if (names.length === 1 && names[0] === "none") return false;
  return names.includes("otlp") ? true : undefined;
}

/**
 * The share of the calls without a `traceparent` that are traced, from
 * OpenTelemetry's sampler settings, or from `GATEWAY_TRACE_SAMPLE_PER_MILLE`
 * where no sampler is named; `off` for `always_off`. The gateway always
 * follows a caller's own decision (a parent-based sampler), so a sampler
 * that would not (`always_on`, `traceidratio`) is a problem, named.
 */
function rootSampling(config: OtlpSettings): number | "off" | { problem: string } {
  const sampler = config.tracesSampler.trim().toLowerCase();
  if (sampler === "") return config.traceSamplePerMille / 1000;
  if (sampler === "always_off") return "off";
  if (sampler === "parentbased_always_on") return 1;
  if (sampler === "parentbased_always_off") return 0;
  if (sampler === "parentbased_traceidratio") {
    const arg = config.tracesSamplerArg.trim();
    if (arg === "") return 1;
    const ratio = Number(arg);
    return /^[0-9.eE+-]+$/.test(arg) && ratio >= 0 && ratio <= 1 ? ratio : { problem: `GATEWAY_TRACES_SAMPLER_ARG (tracesSamplerArg) must be a share from 0 to 1, not ${JSON.stringify(config.tracesSamplerArg)}` };
  }
  return {
    problem: `GATEWAY_TRACES_SAMPLER (tracesSampler) must be parentbased_always_on, parentbased_always_off, parentbased_traceidratio or always_off (the gateway follows a caller's sampled flag), not ${JSON.stringify(config.tracesSampler)}`,
  };
}

/** The traces URL: the signal's own endpoint as written, or the base endpoint with `/v1/traces` (over HTTP). */
function tracesUrl(config: OtlpSettings): string {
  if (config.otlpTracesUrl !== "") return config.otlpTracesUrl;
  if (config.otlpEndpoint === "" || config.otlpProtocol === "grpc") return config.otlpEndpoint;
  return `${config.otlpEndpoint.replace(/\/+$/, "")}/v1/traces`;
}

/**
 * The exporter's plan, from the settings: undefined where no spans are to
 * be recorded (no endpoint, or `GATEWAY_TRACES_EXPORTER=none`). `problems`
 * names what stops the start; a credential's value is never in it.
 * `read` reads the TLS files (the start reads them once).
 */
export function otlpPlan(config: OtlpSettings, read: (file: string) => string = (f) => readFileSync(f, "utf8")): { plan: OtlpPlan | undefined; problems: string[] } {
  const problems: string[] = [];
  const sampling = rootSampling(config);
  if (typeof sampling === "object") problems.push(sampling.problem);
  const wanted = sampling === "off" ? false : exporterWanted(config.tracesExporter);
  if (wanted === undefined) problems.push(`GATEWAY_TRACES_EXPORTER (tracesExporter) must be otlp or none (the gateway sends its spans over OTLP only), not ${JSON.stringify(config.tracesExporter)}`);
  const url = tracesUrl(config);
  if (url !== "") {
    let ok = false;
    try {
      const u = new URL(url);
      ok = (u.protocol === "http:" || u.protocol === "https:") && u.host !== "";
    } catch {
      // named below
    }
    const which = config.otlpTracesUrl !== "" ? "GATEWAY_OTLP_TRACES_URL (otlpTracesUrl)" : "GATEWAY_OTLP_ENDPOINT (otlpEndpoint)";
    if (!ok) problems.push(`${which} must be an http or https URL`);
  }
  const headers = otlpHeaderList(config);
  // Its values are credentials: the problem names the form, never what was sent.
  if (headers === undefined) problems.push("GATEWAY_OTLP_HEADERS (otlpHeaders) must be name=value pairs, comma-separated, percent-encoded");
  const resource = resourceAttributeList(config);
  if (resource === undefined) problems.push("GATEWAY_RESOURCE_ATTRIBUTES (resourceAttributes) must be key=value pairs, comma-separated, percent-encoded");
  if ((config.otlpClientCertificate === "") !== (config.otlpClientKey === "")) problems.push("GATEWAY_OTLP_CLIENT_CERTIFICATE and GATEWAY_OTLP_CLIENT_KEY must be set together");
  const settingOf = { ca: "GATEWAY_OTLP_CERTIFICATE (otlpCertificate)", cert: "GATEWAY_OTLP_CLIENT_CERTIFICATE (otlpClientCertificate)", key: "GATEWAY_OTLP_CLIENT_KEY (otlpClientKey)" } as const;
  const tlsFiles: TlsParts = {};
  if (url !== "" && wanted === true) {
    if (config.otlpCertificate !== "") tlsFiles.ca = config.otlpCertificate;
    if (config.otlpClientCertificate !== "") tlsFiles.cert = config.otlpClientCertificate;
    if (config.otlpClientKey !== "") tlsFiles.key = config.otlpClientKey;
  }
  const found = readTlsFiles(tlsFiles, read);
  const tls = "tls" in found ? found.tls : {};
  if ("problem" in found) problems.push(`${settingOf[found.part]}: ${tlsFiles[found.part]} cannot be read as PEM: ${found.problem}`);
  else if (Object.keys(tls).length > 0) {
    const unusable = tlsProblem(tls);
    if (unusable !== undefined) problems.push(`the collector's TLS files (GATEWAY_OTLP_CERTIFICATE, GATEWAY_OTLP_CLIENT_CERTIFICATE, GATEWAY_OTLP_CLIENT_KEY) cannot be used together: ${unusable}`);
  }
  if (problems.length > 0 || url === "" || wanted !== true) return { plan: undefined, problems };
  const own = resource ?? {};
  const serviceName = config.serviceName !== defaultServiceName ? config.serviceName : (own["service.name"] ?? config.serviceName);
  return {
    plan: {
      url,
      protocol: config.otlpProtocol as OtlpProtocol,
      gzip: config.otlpCompression === "gzip",
      timeoutMs: config.otlpTimeoutMs,
      headers: headers ?? {},
      tls,
      tlsFiles,
      resource: own,
      serviceName,
      rootRatio: typeof sampling === "number" ? sampling : 0,
    },
    problems,
  };
}

/** `service.name` when nothing names one. */
export const defaultServiceName = "product-data-gateway";
