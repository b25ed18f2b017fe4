/**
 * What `work` settles to, or `timedOut` once `ms` have passed first; the
 * timer is cleared either way, so a settled race keeps nothing alive. The
 * work itself goes on: the caller cuts it (an AbortSignal) if it must.
 */
export async function within<T, U>(work: Promise<T>, ms: number, timedOut: U): Promise<T | U> {
  let timer: NodeJS.Timeout | undefined;
  const waited = new Promise<U>((resolve) => {
    timer = setTimeout(resolve, ms, timedOut);
  });
  try {
    return await Promise.race([work, waited]);
  } finally {
    clearTimeout(timer);
  }
}
