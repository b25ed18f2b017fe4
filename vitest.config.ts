import { defineConfig } from "vitest/config";

export default defineConfig({
  test: {
    include: ["test/**/*.test.ts"],
    // Real sockets and child processes on a shared 2-core machine: generous, never a performance check.
    testTimeout: 30_000,
    // expect.poll's own default is 1 s: a console page's debounced search came in later than that once, with
    // the other worker busy. Polls wait for what must come; a longer wait only delays a failure.
    expect: { poll: { timeout: 10_000 } },
    // Files run two at a time (each has its own data directory, ports and processes): on the
    // 2-core machine the default of one worker left a core idle while a file waited on a child.
    maxWorkers: 2,
    hookTimeout: 60_000,
    reporters: ["default", "./test/support/summary-reporter.ts"],
  },
});
