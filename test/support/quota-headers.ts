/**
 * A `RateLimit` field's value with its live figures left out (the calls
 * left and the seconds to reset move from one call to the next), so two
 * answers to the same kind of call compare alike; its members and their
 * order stay.
 */
export function steadyQuota(value: string): string {
  return value.replace(/;r=\d+/g, ";r=…").replace(/;t=\d+/g, ";t=…");
}
