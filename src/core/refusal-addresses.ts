/**
 * The address a call with no account is counted under: itself, or "other"
 * once its day has `perDay` distinct addresses, so a flood from spoofed or
 * rotating addresses cannot grow the counts without bound. `known` reads the
 * addresses a day already has in the store, the first time the day is seen.
 */
export class RefusalAddresses {
  private readonly perDay: number;
  private readonly known: (day: string) => Iterable<string>;
  private readonly days = new Map<string, Set<string>>();

  constructor(perDay: number, known: (day: string) => Iterable<string> = () => []) {
    this.perDay = perDay;
    this.known = known;
  }

  address(day: string, ip: string): string {
    let seen = this.days.get(day);
    if (seen === undefined) {
      if (this.days.size >= 3) this.days.clear();
      try {
        seen = new Set(this.known(day));
      } catch {
        seen = new Set();
      }
      this.days.set(day, seen);
    }
    if (seen.has(ip)) return ip;
    if (seen.size >= this.perDay) return "other";
    seen.add(ip);
    return ip;
  }
}
