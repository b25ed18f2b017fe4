import { execFile } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { defaultConfig } from "../src/config.ts";
import { openRuntime } from "../src/runtime.ts";
import { migrateSchema, openPostgres } from "../src/stores/postgres/postgres-database.ts";
import { makeCertificate } from "./support/certificates.ts";
import { root } from "./support/cli.ts";
import { startGateway } from "./support/gateway-fixture.ts";
import { startServe } from "./support/gateway-process.ts";
import { freshDatabase } from "./support/postgres.ts";

// docs/prometheus-alerts.yml: Prometheus's own checker reads it, its alerts fire on the series they are
// meant for, and every metric a rule names is one a real gateway exports.

const rules = join(root, "docs", "prometheus-alerts.yml");
const run = promisify(execFile);

let dir: string;
beforeAll(() => {
  dir = mkdtempSync(join(tmpdir(), "gateway-alerts-"));
});
afterAll(() => rmSync(dir, { recursive: true, force: true }));

/** The metric names an expression reads, of the gateway's own and its process's (not Prometheus's `up`), label values left out. */
function metricsOf(expr: string): string[] {
  const unquoted = expr.replace(/"[^"]*"/g, '""');
  return [...unquoted.matchAll(/\b((?:gateway|nodejs|process)_[a-z0-9_]+)\b/g)].map((m) => m[1]!);
}

/** The families a scrape declares, each with the series names it gives (a histogram's _bucket, _sum and _count). */
function familiesOf(text: string): Set<string> {
  const names = new Set<string>();
  for (const m of text.matchAll(/^# TYPE (\S+) (\S+)$/gm)) {
    names.add(m[1]!);
    if (m[2] === "histogram") for (const suffix of ["_bucket", "_sum", "_count"]) names.add(`${m[1]}${suffix}`);
  }
  return names;
}

describe("the Prometheus alerting rules", () => {
  it("promtool reads them, and their alerts fire on the series they watch and not before", async () => {
    const checked = await run("promtool", ["check", "rules", rules]);
    expect(checked.stdout).toMatch(/SUCCESS: \d+ rules found/);
    // An alert's labels and annotations as it should fire: the description as the rules write it, the summary rendered.
    const text = readFileSync(rules, "utf8");
    const fires = (alert: string, labels: Record<string, string>, summary: string) => {
      const description = new RegExp(`- alert: ${alert}\\n(?:.*\\n)*?\\s+description: "(.*)"`).exec(text)![1]!;
      return [{ exp_labels: labels, exp_annotations: { summary, description } }];
    };
    const gw1 = { job: "gateway", instance: "gw-1:8080" };
    const gw4 = { job: "gateway", instance: "gw-4:8080" };
    // Series as a gateway's scrape gives them (job and instance added by Prometheus), minute by minute.
    const labels = 'job="gateway", instance="gw-1:8080"';
    const tests = {
      rule_files: [rules],
      evaluation_interval: "1m",
      tests: [
        {
          interval: "1m",
          input_series: [
            // 100 MiB free of a 64 MiB floor: under twice the floor, not under it.
            { series: `gateway_store_free_bytes{${labels}}`, values: "104857600x30" },
            { series: `gateway_store_min_free_bytes{${labels}}`, values: "67108864x30" },
            { series: `gateway_store_bytes{${labels}}`, values: "95+0x30" },
            { series: `gateway_store_max_bytes{${labels}}`, values: "100x30" },
            // A 90-day certificate that expires 10 days after the start of the test's time.
            { series: `gateway_tls_certificate_start_timestamp_seconds{${labels}}`, values: "-6912000x120" },
            { series: `gateway_tls_certificate_expiry_timestamp_seconds{${labels}}`, values: "864000x120" },
            { series: `gateway_circuit_open{${labels}, catalogue="retail"}`, values: "0 0 1x10" },
            { series: `gateway_ledger_feed_held_seconds{${labels}}`, values: "0.01 0.01 120x10" },
            // Two calls told 4000 at minute 3 that the ledger later showed charged; nothing more for the next hour and more.
            { series: `gateway_ledger_unanswered_calls_total{${labels}, outcome="landed_late"}`, values: "0 0 0 2x80" },
            // A client certificate for the collector valid from the test's start for 100 minutes: 80% through at 80m.
            { series: `gateway_otlp_client_certificate_start_timestamp_seconds{${labels}}`, values: "0x120" },
            { series: `gateway_otlp_client_certificate_expiry_timestamp_seconds{${labels}}`, values: "6000x120" },
            { series: `gateway_otlp_tls_renewals_total{${labels}, outcome="refused"}`, values: "0 0 1x10" },
            // 40 log lines dropped at minute 2 (a reader behind), none after: the alert holds for 10 minutes.
            { series: `gateway_log_lines_dropped_total{${labels}, reason="backlog"}`, values: "0 0 40x30" },
            // A heap of a 512 MiB limit at 30% to minute 5, at 90% (after every collection) from 6 to 26, then back.
            { series: `nodejs_heap_size_used_bytes{${labels}}`, values: "161061273x5 483183820x20 161061273x20" },
            { series: `gateway_heap_limit_bytes{${labels}}`, values: "536870912x50" },
            // 700 MiB resident from minute 3 to 31, past a bound of 662 MiB (a 512 MiB budget and 150 MiB of overhead).
            { series: `process_resident_memory_bytes{${labels}}`, values: "524288000x2 734003200x28 524288000x20" },
            { series: `gateway_memory_resident_bound_bytes{${labels}}`, values: "694157312x50" },
            // 8,500 of a cap of 10,000 connections open from minute 2 to 12; HTTP/2 streams at 9,000 of it from 20 to 30.
            { series: `gateway_connections_open{${labels}}`, values: "100x1 8500x10 100x40" },
            { series: `gateway_http2_streams_open{${labels}}`, values: "0x19 9000x10 0x20" },
            { series: `gateway_connections_max{${labels}}`, values: "10000x50" },
            // 950 of 1,024 files open from minute 3 to 12 (over 90%), then 500.
            { series: `process_open_fds{${labels}}`, values: "100x2 950x9 500x30" },
            { series: `process_max_fds{${labels}}`, values: "1024x50" },
            // One address holding 3,000 of the 10,000 from minute 5 to 20, then 2,600 from 32 to 37.
            { series: `gateway_connections_most_from_one_address{${labels}}`, values: "10x4 3000x15 10x10 2600x5" },
            // Three connections refused at the cap at minute 4, none after; streams never.
            { series: `gateway_connections_refused_total{${labels}, what="connection"}`, values: "0 0 0 0 3x30" },
            { series: `gateway_connections_refused_total{${labels}, what="stream"}`, values: "0x30" },
            // Redis lost at minute 3, back at minute 9.
            { series: `gateway_redis_up{${labels}}`, values: "1 1 1 0x5 1x20" },
            // The clock 70 s ahead of PostgreSQL's from minute 2 (an NTP daemon stopped), back in step at minute 20.
            { series: `gateway_clock_offset_seconds{${labels}}`, values: "0.002 0.001 70x17 0.003x10" },
            // The provider refuses the gateway's account for its balance from minute 3 (3 calls a minute), topped up at minute 6.
            { series: `gateway_upstream_refused_total{${labels}, operation="retail/item_get", code="4016"}`, values: "0 0 0 3 6 9 12x30" },
            // And holds 20 calls a minute back for its limit on them throughout.
            { series: `gateway_upstream_refused_total{${labels}, operation="retail/item_get", code="4008"}`, values: "0+20x30" },
            // A provider that asked for waits: calls held unsent, 3 a minute for 20 minutes, then none.
            { series: `gateway_upstream_requests_total{${labels}, operation="retail/item_get", outcome="held"}`, values: "0+3x20 60x40" },
          ],
          alert_rule_test: [
            { eval_time: "5m", alertname: "GatewayDiskLow", exp_alerts: [] },
            { eval_time: "11m", alertname: "GatewayDiskLow", exp_alerts: fires("GatewayDiskLow", { severity: "warning", ...gw1 }, "Gateway gw-1:8080's data directory has 100MiB free") },
            { eval_time: "11m", alertname: "GatewayDiskFloorReached", exp_alerts: [] },
            { eval_time: "11m", alertname: "GatewayStoreNearCap", exp_alerts: fires("GatewayStoreNearCap", { severity: "warning", ...gw1 }, "Gateway gw-1:8080's store is at 95% of GATEWAY_STORE_MAX_BYTES") },
            { eval_time: "61m", alertname: "GatewayTlsCertificateExpiring", exp_alerts: fires("GatewayTlsCertificateExpiring", { severity: "warning", ...gw1 }, "Gateway gw-1:8080's TLS certificate expires in 9d 22h 59m 0s") },
            { eval_time: "61m", alertname: "GatewayTlsCertificateExpiringSoon", exp_alerts: [] },
            { eval_time: "4m", alertname: "GatewayUpstreamCircuitOpen", exp_alerts: [] },
            { eval_time: "8m", alertname: "GatewayUpstreamCircuitOpen", exp_alerts: fires("GatewayUpstreamCircuitOpen", { severity: "critical", instance: "gw-1:8080", catalogue: "retail" }, "The upstream provider of retail has been failing for 5 minutes") },
            { eval_time: "4m", alertname: "GatewayUpstreamAccountRefused", exp_alerts: [] },
            { eval_time: "6m", alertname: "GatewayUpstreamAccountRefused", exp_alerts: fires("GatewayUpstreamAccountRefused", { severity: "critical", instance: "gw-1:8080", code: "4016" }, "The upstream provider refuses gateway gw-1:8080's own account (its code 4016)") },
            { eval_time: "13m", alertname: "GatewayUpstreamAccountRefused", exp_alerts: [] },
            { eval_time: "10m", alertname: "GatewayUpstreamHoldingBack", exp_alerts: [] },
            { eval_time: "13m", alertname: "GatewayUpstreamHoldingBack", exp_alerts: fires("GatewayUpstreamHoldingBack", { severity: "warning", instance: "gw-1:8080", code: "4008" }, "The upstream provider holds gateway gw-1:8080's calls back (its code 4008)") },
            { eval_time: "12m", alertname: "GatewayUpstreamAskedToWait", exp_alerts: [] },
            { eval_time: "16m", alertname: "GatewayUpstreamAskedToWait", exp_alerts: fires("GatewayUpstreamAskedToWait", { severity: "warning", instance: "gw-1:8080" }, "The upstream provider has asked gateway gw-1:8080 to wait (Retry-After)") },
            { eval_time: "30m", alertname: "GatewayUpstreamAskedToWait", exp_alerts: [] },
            { eval_time: "2m", alertname: "GatewayCallsChargedUnanswered", exp_alerts: [] },
            { eval_time: "3m", alertname: "GatewayCallsChargedUnanswered", exp_alerts: fires("GatewayCallsChargedUnanswered", { severity: "warning", outcome: "landed_late", ...gw1 }, "Gateway gw-1:8080 told calls 4000 that its ledger then showed charged") },
            { eval_time: "70m", alertname: "GatewayCallsChargedUnanswered", exp_alerts: [] },
            { eval_time: "1m", alertname: "GatewayLogLinesDropped", exp_alerts: [] },
            { eval_time: "2m", alertname: "GatewayLogLinesDropped", exp_alerts: fires("GatewayLogLinesDropped", { severity: "warning", reason: "backlog", ...gw1 }, "Gateway gw-1:8080 dropped 40 log lines in 10 minutes (backlog)") },
            { eval_time: "13m", alertname: "GatewayLogLinesDropped", exp_alerts: [] },
            { eval_time: "15m", alertname: "GatewayHeapNearLimit", exp_alerts: [] },
            { eval_time: "16m", alertname: "GatewayHeapNearLimit", exp_alerts: fires("GatewayHeapNearLimit", { severity: "critical", ...gw1 }, "Gateway gw-1:8080's heap has stayed above 85% of its limit for 10 minutes (90% at its lowest)") },
            { eval_time: "27m", alertname: "GatewayHeapNearLimit", exp_alerts: [] },
            { eval_time: "17m", alertname: "GatewayMemoryOverBound", exp_alerts: [] },
            { eval_time: "18m", alertname: "GatewayMemoryOverBound", exp_alerts: fires("GatewayMemoryOverBound", { severity: "warning", ...gw1 }, "Gateway gw-1:8080 holds 700MiB resident, past its memory budget and overhead, for 15 minutes") },
            { eval_time: "33m", alertname: "GatewayMemoryOverBound", exp_alerts: [] },
            { eval_time: "6m", alertname: "GatewayConnectionsNearCap", exp_alerts: [] },
            { eval_time: "7m", alertname: "GatewayConnectionsNearCap", exp_alerts: fires("GatewayConnectionsNearCap", { severity: "warning", instance: "gw-1:8080" }, "Gateway gw-1:8080 has held over 80% of GATEWAY_MAX_CONNECTIONS for 5 minutes (85%)") },
            { eval_time: "14m", alertname: "GatewayConnectionsNearCap", exp_alerts: [] },
            { eval_time: "25m", alertname: "GatewayConnectionsNearCap", exp_alerts: fires("GatewayConnectionsNearCap", { severity: "warning", instance: "gw-1:8080" }, "Gateway gw-1:8080 has held over 80% of GATEWAY_MAX_CONNECTIONS for 5 minutes (90%)") },
            // Past a quarter from minute 5 to 20: pending until held 10 minutes; the 6 minutes from 32 never fire.
            { eval_time: "14m", alertname: "GatewayConnectionsHeldByOneAddress", exp_alerts: [] },
            {
              eval_time: "15m",
              alertname: "GatewayConnectionsHeldByOneAddress",
              exp_alerts: fires("GatewayConnectionsHeldByOneAddress", { severity: "warning", instance: "gw-1:8080" }, "One client address has held over a quarter of gateway gw-1:8080's GATEWAY_MAX_CONNECTIONS for 10 minutes (30%)"),
            },
            { eval_time: "22m", alertname: "GatewayConnectionsHeldByOneAddress", exp_alerts: [] },
            { eval_time: "37m", alertname: "GatewayConnectionsHeldByOneAddress", exp_alerts: [] },
            { eval_time: "7m", alertname: "GatewayOpenFilesNearLimit", exp_alerts: [] },
            { eval_time: "8m", alertname: "GatewayOpenFilesNearLimit", exp_alerts: fires("GatewayOpenFilesNearLimit", { severity: "warning", instance: "gw-1:8080" }, "Gateway gw-1:8080 has held over 90% of its open-files limit for 5 minutes (92.77%)") },
            { eval_time: "13m", alertname: "GatewayOpenFilesNearLimit", exp_alerts: [] },
            { eval_time: "3m", alertname: "GatewayConnectionsRefused", exp_alerts: [] },
            { eval_time: "4m", alertname: "GatewayConnectionsRefused", exp_alerts: fires("GatewayConnectionsRefused", { severity: "critical", instance: "gw-1:8080", what: "connection" }, "Gateway gw-1:8080 refused 3 connections at its connection caps in 5 minutes") },
            { eval_time: "10m", alertname: "GatewayConnectionsRefused", exp_alerts: [] },
            { eval_time: "4m", alertname: "GatewayRedisDown", exp_alerts: [] },
            { eval_time: "5m", alertname: "GatewayRedisDown", exp_alerts: fires("GatewayRedisDown", { severity: "warning", ...gw1 }, "Gateway gw-1:8080 has served without Redis for 2 minutes") },
            { eval_time: "10m", alertname: "GatewayRedisDown", exp_alerts: [] },
            { eval_time: "11m", alertname: "GatewayClockOffset", exp_alerts: [] },
            { eval_time: "12m", alertname: "GatewayClockOffset", exp_alerts: fires("GatewayClockOffset", { severity: "warning", ...gw1 }, "Gateway gw-1:8080's clock is 1m 10s away from PostgreSQL's") },
            { eval_time: "20m", alertname: "GatewayClockOffset", exp_alerts: [] },
            { eval_time: "8m", alertname: "GatewayFeedHeld", exp_alerts: fires("GatewayFeedHeld", { severity: "warning", ...gw1 }, "The ledger's feed has held calls back for 2m 0s") },
            { eval_time: "84m", alertname: "GatewayCollectorCertificateNotRenewed", exp_alerts: [] },
            { eval_time: "87m", alertname: "GatewayCollectorCertificateNotRenewed", exp_alerts: fires("GatewayCollectorCertificateNotRenewed", { severity: "warning", ...gw1 }, "Gateway gw-1:8080's client certificate for the OTLP collector is 87% through its life") },
            { eval_time: "1m", alertname: "GatewayCollectorTlsRenewalRefused", exp_alerts: [] },
            { eval_time: "5m", alertname: "GatewayCollectorTlsRenewalRefused", exp_alerts: fires("GatewayCollectorTlsRenewalRefused", { severity: "warning", outcome: "refused", ...gw1 }, "Gateway gw-1:8080 refused renewed TLS files for the OTLP collector") },
          ],
        },
        {
          // Certificates of other lives: a day's served certificate (gw-1) is not "expiring" all day long, and a
          // year's client certificate for the collector is not "not renewed" two months before its end (gw-2), only near it (gw-3).
          // A gateway from before the start gauge (gw-4) is held to the fixed times alone.
          interval: "1m",
          input_series: [
            { series: 'gateway_tls_certificate_expiry_timestamp_seconds{job="gateway", instance="gw-4:8080"}', values: `${2 * 86400}x1440` },
            { series: `gateway_tls_certificate_start_timestamp_seconds{${labels}}`, values: "0x1440" },
            { series: `gateway_tls_certificate_expiry_timestamp_seconds{${labels}}`, values: "86400x1440" },
            { series: 'gateway_otlp_client_certificate_start_timestamp_seconds{job="gateway", instance="gw-2:8080"}', values: `${-305 * 86400}x30` },
            { series: 'gateway_otlp_client_certificate_expiry_timestamp_seconds{job="gateway", instance="gw-2:8080"}', values: `${60 * 86400}x30` },
            { series: 'gateway_otlp_client_certificate_start_timestamp_seconds{job="gateway", instance="gw-3:8080"}', values: `${-355 * 86400}x30` },
            { series: 'gateway_otlp_client_certificate_expiry_timestamp_seconds{job="gateway", instance="gw-3:8080"}', values: `${10 * 86400}x30` },
          ],
          alert_rule_test: [
            { eval_time: "1h", alertname: "GatewayTlsCertificateExpiring", exp_alerts: fires("GatewayTlsCertificateExpiring", { severity: "warning", ...gw4 }, "Gateway gw-4:8080's TLS certificate expires in 1d 23h 0m 0s") },
            { eval_time: "19h10m", alertname: "GatewayTlsCertificateExpiring", exp_alerts: fires("GatewayTlsCertificateExpiring", { severity: "warning", ...gw4 }, "Gateway gw-4:8080's TLS certificate expires in 1d 4h 50m 0s") },
            {
              eval_time: "19h20m",
              alertname: "GatewayTlsCertificateExpiring",
              exp_alerts: [
                ...fires("GatewayTlsCertificateExpiring", { severity: "warning", ...gw1 }, "Gateway gw-1:8080's TLS certificate expires in 4h 40m 0s"),
                ...fires("GatewayTlsCertificateExpiring", { severity: "warning", ...gw4 }, "Gateway gw-4:8080's TLS certificate expires in 1d 4h 40m 0s"),
              ],
            },
            { eval_time: "22h45m", alertname: "GatewayTlsCertificateExpiringSoon", exp_alerts: fires("GatewayTlsCertificateExpiringSoon", { severity: "critical", ...gw4 }, "Gateway gw-4:8080's TLS certificate expires in 1d 1h 15m 0s") },
            {
              eval_time: "22h55m",
              alertname: "GatewayTlsCertificateExpiringSoon",
              exp_alerts: [
                ...fires("GatewayTlsCertificateExpiringSoon", { severity: "critical", ...gw1 }, "Gateway gw-1:8080's TLS certificate expires in 1h 5m 0s"),
                ...fires("GatewayTlsCertificateExpiringSoon", { severity: "critical", ...gw4 }, "Gateway gw-4:8080's TLS certificate expires in 1d 1h 5m 0s"),
              ],
            },
            {
              eval_time: "10m",
              alertname: "GatewayCollectorCertificateNotRenewed",
              exp_alerts: fires("GatewayCollectorCertificateNotRenewed", { severity: "warning", job: "gateway", instance: "gw-3:8080" }, "Gateway gw-3:8080's client certificate for the OTLP collector is 97.26% through its life"),
            },
          ],
        },
      ],
    };
    const file = join(dir, "alerts.test.yml");
    writeFileSync(file, JSON.stringify(tests)); // JSON is YAML
    const tested = await run("promtool", ["test", "rules", file]).catch((e: { stdout: string; stderr: string }) => ({ stdout: e.stdout, stderr: e.stderr, failed: true }));
    expect(tested, `${tested.stdout}\n${tested.stderr}`).toMatchObject({ stdout: expect.stringContaining("SUCCESS") });
  });

  it("name only metrics a real gateway exports: embedded with TLS, both storage limits and a collector over mutual TLS, shared, and `gateway serve` itself", async () => {
    const named = new Set([...readFileSync(rules, "utf8").matchAll(/^\s*expr: (.*)$/gm)].flatMap((m) => metricsOf(m[1]!)));
    expect(named.size).toBeGreaterThan(10);
    makeCertificate(dir, "gw");
    makeCertificate(dir, "collector-client");
    // A collector over mutual TLS (nothing listens there: the exporter's metrics are made at its start).
    const collector = { otlpTracesUrl: "https://127.0.0.1:9/v1/traces", otlpClientCertificate: join(dir, "collector-client.cert.pem"), otlpClientKey: join(dir, "collector-client.key.pem") };
    const gw = await startGateway({ config: { tlsCert: join(dir, "gw.cert.pem"), tlsKey: join(dir, "gw.key.pem"), storeMaxBytes: 50_000_000, minFreeMb: 64, ...collector } });
    let exported: Set<string>;
    try {
      exported = familiesOf(await gw.runtime.metrics.scrape());
    } finally {
      await gw.close();
    }
    // The feed's hold is the shared store's alone.
    const database = await freshDatabase("alerts");
    try {
      const pool = openPostgres(database.url, { max: 1 });
      await migrateSchema(pool);
      await pool.end();
      const shared = await openRuntime({ ...defaultConfig, databaseUrl: database.url, redisUrl: "redis://127.0.0.1:6379/13" });
      try {
        for (const name of familiesOf(await shared.metrics.scrape())) exported.add(name);
      } finally {
        await shared.close();
      }
    } finally {
      await database.drop();
    }
    // What only `gateway serve` counts (its stdout: log-output.ts), from a real one.
    const served = await startServe({ GATEWAY_DATA_DIR: join(dir, "serve") });
    try {
      for (const name of familiesOf(await (await fetch(`${served.base}/metrics`)).text())) exported.add(name);
    } finally {
      served.child.kill("SIGKILL");
    }
    expect([...named].filter((name) => !exported.has(name))).toEqual([]);
  });
});
