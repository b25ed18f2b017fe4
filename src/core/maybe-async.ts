/**
 * What a port answers: the value itself when it has it at hand (the
 * embedded store, from memory), a promise when it must ask elsewhere (a
 * shared store). The core awaits only promises, so a cache hit served from
 * memory runs to its ledger write without giving up the event loop, and
 * without a promise and a microtask for each step it took (a dozen on a hit:
 * see the README's Performance section).
 *
 * A port that answers at once reports a failure by throwing; one that
 * answers later, by rejecting. The core handles both the same way (inside
 * one try).
 */
export type MaybeAsync<T> = T | Promise<T>;

/** `f` of the value, at once when the value is at hand, after it settles when it is a promise. */
export function thenMaybe<T, R>(value: MaybeAsync<T>, f: (value: T) => MaybeAsync<R>): MaybeAsync<R> {
  return value instanceof Promise ? value.then(f) : f(value);
}
