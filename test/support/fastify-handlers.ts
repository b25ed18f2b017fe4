import diagnostics from "node:diagnostics_channel";

/**
 * How many Fastify route handlers ran while `work` did: Fastify announces
 * each on this channel (handle-request.js). A fast path that answers
 * before Fastify runs none.
 */
export async function fastifyHandlers<T>(work: () => Promise<T>): Promise<{ result: T; handled: number }> {
  let handled = 0;
  const count = () => handled++;
  diagnostics.subscribe("tracing:fastify.request.handler:start", count);
  try {
    const result = await work();
    return { result, handled };
  } finally {
    diagnostics.unsubscribe("tracing:fastify.request.handler:start", count);
  }
}
