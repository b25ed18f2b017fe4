// What a gateway answered over a load, by its own count (its /metrics): a
// legacy refusal is an HTTP 200 like a hit, so only the gateway can say that
// a case measured what it is named for.
import type { LoadResult } from "./grpc-load.ts";

/** A gateway's answers over a run: calls by four-digit code, and cache hits. */
export interface Answers {
  readonly calls: number;
  readonly byCode: Readonly<Record<string, number>>;
  readonly cacheHits: number;
}

/** The gateway's calls by code, and its cache hits, so far (its /metrics). */
export async function answerCounts(base: string): Promise<Answers> {
  const text = await (await fetch(`${base}/metrics`)).text();
  const byCode: Record<string, number> = {};
  let calls = 0;
  for (const m of text.matchAll(/^gateway_calls_total\{[^}]*code="(\d{4})"[^}]*\} (\d+)$/gm)) {
    byCode[m[1]!] = (byCode[m[1]!] ?? 0) + Number(m[2]);
    calls += Number(m[2]);
  }
  let cacheHits = 0;
  for (const m of text.matchAll(/^gateway_cache_events_total\{[^}]*result="hit"[^}]*\} (\d+)$/gm)) cacheHits += Number(m[1]);
  return { calls, byCode, cacheHits };
}

/** The bytes the gateway's response cache counts now (gateway_cache_bytes, its /metrics). */
export async function cacheBytes(base: string): Promise<number> {
  return Number(/^gateway_cache_bytes (\d+)/m.exec(await (await fetch(`${base}/metrics`)).text())![1]);
}

/**
 * Runs a load on the gateway at `base` and adds what it answered, by its own
 * count: a legacy refusal is an HTTP 200 like a hit, so only the gateway
 * can say that a case measured what it is named for (after case 7a's flood
 * of wrong secrets the loopback address is refused, 4008, for five minutes).
 */
export async function answered(base: string, load: () => Promise<LoadResult>): Promise<LoadResult> {
  const before = await answerCounts(base);
  const r = await load();
  const after = await answerCounts(base);
  const byCode: Record<string, number> = {};
  for (const [code, n] of Object.entries(after.byCode)) if (n - (before.byCode[code] ?? 0) > 0) byCode[code] = n - (before.byCode[code] ?? 0);
  return { ...r, answers: { calls: after.calls - before.calls, byCode, cacheHits: after.cacheHits - before.cacheHits } };
}

/** Answers added up over runs. */
export function addAnswers(a: Answers | undefined, b: Answers | undefined): Answers | undefined {
  if (a === undefined || b === undefined) return a ?? b;
  const byCode: Record<string, number> = { ...a.byCode };
  for (const [code, n] of Object.entries(b.byCode)) byCode[code] = (byCode[code] ?? 0) + n;
  return { calls: a.calls + b.calls, byCode, cacheHits: a.cacheHits + b.cacheHits };
}

/** "0000 100.0%; cache hits 100.0%" (or the mix of codes). */
export function answerText(a: Answers): string {
  const share = (n: number) => `${((100 * n) / Math.max(1, a.calls)).toFixed(1)}%`;
  const codes = Object.entries(a.byCode).sort((x, y) => y[1] - x[1]).map(([code, n]) => `${code} ${share(n)}`);
  return `${codes.join(", ") || "no calls"}; cache hits ${share(a.cacheHits)}`;
}

/** Whether a hit case's answers were hits: every call 0000 from the cache (a call or two at a run's edges aside). */
export const allHits = (a: Answers | undefined): boolean => a !== undefined && a.calls > 0 && (a.byCode["0000"] ?? 0) >= 0.999 * a.calls && a.cacheHits >= 0.999 * a.calls;
