// A warning or error that repeats is written once a window, then counted (src/transports/server/repeated-lines.ts):
// a cause every call meets must not write its line, stack and all, for every call. Here at the logger;
// test/shared-database-outage.test.ts checks it on a real `gateway serve` whose PostgreSQL goes away.
import { describe, expect, it } from "vitest";
import { createLogger, flushRepeatedLines } from "../src/transports/server/logger.ts";
import { everyLine } from "../src/transports/server/repeated-lines.ts";

interface Line {
  level: number;
  msg: string;
  requestId?: string;
  err?: { type: string; message: string; code?: string; stack?: string };
  repeated?: number;
  repeatedSince?: string;
  repeatedSeconds?: number;
  firstRequestId?: string;
  lastRequestId?: string;
}

function logger(repeatWindowSeconds?: number, level = "info") {
  const lines: Line[] = [];
  const log = createLogger({ level, repeatWindowSeconds, stream: { write: (l: string) => lines.push(JSON.parse(l) as Line) } as unknown as NodeJS.WritableStream });
  return { log, lines };
}

/** An error as node-postgres gives one for a connection the server reset, made at one place (one first frame). */
function reset(): Error {
  return Object.assign(new Error("read ECONNRESET"), { code: "ECONNRESET", errno: -104 });
}

describe("a warning or error that repeats", () => {
  it("is written whole once, then counted: one line with how many, since when, and the first and last request ids", () => {
    const { log, lines } = logger();
    for (let i = 0; i < 500; i++) log.error({ err: reset(), requestId: `r${i}` }, "the shared database (PostgreSQL) cannot be reached");
    expect(lines).toHaveLength(1);
    expect(lines[0]!.requestId).toBe("r0");
    expect(lines[0]!.err?.stack).toContain("read ECONNRESET");
    flushRepeatedLines(log);
    expect(lines).toHaveLength(2);
    const count = lines[1]!;
    expect(count).toMatchObject({ level: 50, msg: "the shared database (PostgreSQL) cannot be reached", repeated: 499, firstRequestId: "r1", lastRequestId: "r499" });
    expect(count.err).toMatchObject({ type: "Error", message: "read ECONNRESET", code: "ECONNRESET" });
    expect(Date.parse(count.repeatedSince!)).toBeGreaterThan(Date.now() - 60_000);
    expect(count.requestId).toBeUndefined();
    // Nothing is left to say.
    flushRepeatedLines(log);
    expect(lines).toHaveLength(2);
  });

  it("writes its count when the window ends, and the next one whole again", async () => {
    const { log, lines } = logger(0.2);
    for (let i = 0; i < 3; i++) log.warn({ err: reset(), requestId: `a${i}` }, "a provider answered late");
    expect(lines).toHaveLength(1);
    const until = Date.now() + 10_000;
    while (lines.length < 2 && Date.now() < until) await new Promise((r) => setTimeout(r, 20));
    expect(lines[1]).toMatchObject({ level: 40, msg: "a provider answered late", repeated: 2, firstRequestId: "a1", lastRequestId: "a2" });
    expect(lines[1]!.repeatedSeconds).toBeGreaterThanOrEqual(0.2);
    log.warn({ err: reset(), requestId: "b0" }, "a provider answered late");
    expect(lines).toHaveLength(3);
    expect(lines[2]).toMatchObject({ requestId: "b0" });
    expect(lines[2]!.repeated).toBeUndefined();
    // A cause met once in its window writes no count.
    await new Promise((r) => setTimeout(r, 400));
    expect(lines).toHaveLength(3);
  });

  it("keeps different causes apart: another message, error code, error message or place the error was made", () => {
    const { log, lines } = logger();
    const made = [reset(), reset()];
    // The same words, code and type, made elsewhere (another first frame of its stack).
    const elsewhere = Object.assign(new Error("read ECONNRESET"), { code: "ECONNRESET", errno: -104 });
    for (let i = 0; i < 3; i++) {
      log.error({ err: made[i % 2] }, "the usage ledger cannot be written");
      log.error({ err: made[i % 2] }, "the shared database (PostgreSQL) cannot be reached");
      log.error({ err: Object.assign(new Error("read ECONNRESET"), { code: "EPIPE" }) }, "the usage ledger cannot be written");
      log.error({ err: Object.assign(new Error("connect ECONNREFUSED 127.0.0.1:5432"), { code: "ECONNRESET" }) }, "the usage ledger cannot be written");
      log.error({ err: elsewhere }, "the usage ledger cannot be written");
      log.error("no error at all");
    }
    expect(lines).toHaveLength(6);
    flushRepeatedLines(log);
    expect(lines.slice(6).map((l) => l.repeated)).toEqual([2, 2, 2, 2, 2, 2]);
  });

  it("holds neither access nor lifecycle lines (info and below), nor fatal ones, nor a line marked to be written every time", () => {
    const { log, lines } = logger(10, "debug");
    for (let i = 0; i < 3; i++) {
      log.info({ requestId: `r${i}`, errorCode: "4000" }, "request completed");
      log.debug("a detail");
      log.fatal({ err: reset() }, "cannot go on");
      log.error(everyLine({ err: reset(), requestIds: [`r${i}`] }), "an unconfirmed ledger commit had committed: refund them");
    }
    expect(lines).toHaveLength(12);
    flushRepeatedLines(log);
    expect(lines).toHaveLength(12);
    // The mark is not written.
    expect(Object.keys(lines[3]!)).not.toContain("keepEveryLine");
  });

  it("takes a held line's request id from its logger where the line has none (a request's own logger)", () => {
    const { log, lines } = logger();
    for (const id of ["c0", "c1", "c2"]) log.child({ requestId: id }).error({ err: reset() }, "request failed");
    flushRepeatedLines(log);
    expect(lines.map((l) => [l.requestId, l.repeated, l.firstRequestId, l.lastRequestId])).toEqual([
      ["c0", undefined, undefined, undefined],
      [undefined, 2, "c1", "c2"],
    ]);
  });

  it("writes every line with a window of 0", () => {
    const { log, lines } = logger(0);
    for (let i = 0; i < 50; i++) log.error({ err: reset(), requestId: `r${i}` }, "the usage ledger cannot be written");
    expect(lines).toHaveLength(50);
  });

  it("writes a message that varies call by call whole each time, holding no more than a thousand causes", () => {
    const { log, lines } = logger();
    for (let i = 0; i < 1_500; i++) log.error(`internal error; quote request id r${i}`);
    expect(lines).toHaveLength(1_500);
    // The thousand it holds are forgotten at their window's end (or a flush), with nothing to count.
    flushRepeatedLines(log);
    expect(lines).toHaveLength(1_500);
  });
});
