import { Counter, Histogram, Registry } from "prom-client";
import { describe, expect, it } from "vitest";
import { ErrorCode } from "../src/gen/gateway/catalogue/v1/status_pb.js";
import { latencyBuckets, PrometheusTelemetry } from "../src/transports/server/metrics.ts";

/** The lines of one family (and its _bucket/_sum/_count series) in an exposition. */
function family(text: string, name: string): string[] {
  return text.split("\n").filter((l) => l.startsWith(`${name}_`) || l.startsWith(`${name}{`) || l.startsWith(`${name} `) || l.endsWith(` ${name} counter`) || l.includes(` ${name} `));
}

describe("call metrics counted in cells", () => {
  it("expose the same text and JSON as prom-client's own counter and histogram fed the same calls", async () => {
    const telemetry = new PrometheusTelemetry();
    const reference = new Registry();
    const calls = new Counter({ name: "gateway_calls_total", help: "Calls answered, by operation (empty: none reached), four-digit code and transport.", labelNames: ["operation", "code", "transport"], registers: [reference] });
    const seconds = new Histogram({ name: "gateway_call_duration_seconds", help: "Time from a call's arrival in the core to its answer, ledger commit included.", labelNames: ["operation", "transport"], buckets: latencyBuckets, registers: [reference] });
    // Durations on, between and past the bounds, in several label sets, scraped twice midway.
    const durations = [0, 0.0005, 0.0004999, 0.0005001, 0.003, 0.01, 0.7, 10, 10.5, 99, 1e-9];
    const labelSets: [string, ErrorCode, "legacy" | "connect" | "grpc"][] = [
      ["retail/item_get", ErrorCode.SUCCESS, "legacy"],
      ["retail/item_get", ErrorCode.ACCOUNT_NOT_FOUND, "legacy"],
      ["retail/item_get", ErrorCode.SUCCESS, "connect"],
      ["", ErrorCode.API_NOT_FOUND, "legacy"],
      ["wholesale/item_search_peerbuy", ErrorCode.NO_RESULT, "grpc"],
    ];
    let n = 0;
    for (const round of [0, 1, 2]) {
      for (const [operation, code, transport] of labelSets) {
        for (const d of durations.slice(0, 3 + ((n++ * 7) % durations.length))) {
          telemetry.callStarted();
          telemetry.callFinished(operation, code, transport, d * (round + 1));
          calls.labels(operation, String(code).padStart(4, "0"), transport).inc();
          seconds.labels(operation, transport).observe(d * (round + 1));
        }
      }
      const ours = await telemetry.registry.metrics();
      const theirs = await reference.metrics();
      for (const name of ["gateway_calls_total", "gateway_call_duration_seconds"]) {
        expect(family(ours, name).length).toBeGreaterThan(3);
        expect(family(ours, name)).toEqual(family(theirs, name));
      }
      const json = (metrics: { name: string }[], name: string) => metrics.find((m) => m.name === name);
      const oursJson = await telemetry.registry.getMetricsAsJSON();
      const theirsJson = await reference.getMetricsAsJSON();
      for (const name of ["gateway_calls_total", "gateway_call_duration_seconds"]) expect(json(oursJson, name)).toEqual(json(theirsJson, name));
    }
  });
});
