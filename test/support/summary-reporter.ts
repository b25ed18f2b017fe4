import type { Reporter, TestModule } from "vitest/node";

/**
 * Prints one plain closing line, `N passed, N failed, N skipped`, after
 * Vitest's own summary, so any CI can read the counts. Unhandled errors and
 * modules that failed outside their tests (not loaded, a hook that threw) count as failures.
 */
export default class SummaryReporter implements Reporter {
  onTestRunEnd(testModules: ReadonlyArray<TestModule>, unhandledErrors: ReadonlyArray<unknown>): void {
    let passed = 0;
    let failed = unhandledErrors.length;
    let skipped = 0;
    for (const module of testModules) {
      let failedTests = 0;
      for (const test of module.children.allTests()) {
        const state = test.result().state;
        if (state === "passed") passed++;
        else if (state === "failed") failedTests++;
        else skipped++;
      }
      failed += failedTests;
      // A module that failed outside its tests (it did not load, or a beforeAll threw and its tests were skipped) is a failure too.
      if (module.state() === "failed" && failedTests === 0) failed++;
    }
    process.stdout.write(`\n${passed} passed, ${failed} failed, ${skipped} skipped\n`);
  }
}
