import { Code, ConnectError, type Interceptor } from "@connectrpc/connect";

/**
 * The services whose requests say what to change or what to select (the
 * AdminService, a team's AccountService) take only the fields they have.
 *
 * connect-node, by default, drops a JSON key its schema lacks and keeps a
 * binary field it lacks unread: for forward compatibility, and right for
 * the catalogue calls, whose answers must match a bare connect-node's. For
 * these two it turned a misspelt or newer field into a silent default:
 * `CreateAccount` with `"dailyMaximum": 500` made an account of 10,000 calls
 * a day and answered OK, and `ListMyCalls` with `"errorCod"` gave every call
 * instead of the refused ones. So JSON keys and enum names they do not have
 * are refused (`jsonOptions`, protobuf-es's own check, which names the key),
 * and so is a binary field number (`refuseUnknownFields`): `invalid_argument`,
 * as for a body that does not decode, and nothing is done.
 */
export const knownJsonOnly = { jsonOptions: { ignoreUnknownFields: false } } as const;

/** Refuses a request message (each message of a stream) that carries a field number its schema lacks, at any depth. */
export const refuseUnknownFields: Interceptor = (next) => async (req) => {
  if (!req.stream) {
    refuseIfUnknown(req.message, req.method.input.typeName);
    return await next(req);
  }
  const typeName = req.method.input.typeName;
  const messages = req.message;
  return await next({
    ...req,
    message: (async function* () {
      for await (const m of messages) {
        refuseIfUnknown(m, typeName);
        yield m;
      }
    })(),
  });
};

function refuseIfUnknown(message: unknown, typeName: string): void {
  const at = unknownFieldIn(message, "");
  if (at !== undefined) {
    throw new ConnectError(`cannot decode message ${typeName}: field number ${at.no}${at.path === "" ? "" : ` in ${at.path}`} is unknown to this gateway (a client built from a newer schema?)`, Code.InvalidArgument);
  }
}

/** The first field number a message (or one inside it: a field, a list's element, a map's value, a oneof's) holds unread. */
function unknownFieldIn(value: unknown, path: string): { no: number; path: string } | undefined {
  if (typeof value !== "object" || value === null || value instanceof Uint8Array) return undefined;
  if (Array.isArray(value)) {
    for (let i = 0; i < value.length; i++) {
      const found = unknownFieldIn(value[i], `${path}[${i}]`);
      if (found !== undefined) return found;
    }
    return undefined;
  }
  const unknown = (value as { $unknown?: readonly { no: number }[] }).$unknown;
  if (unknown !== undefined && unknown.length > 0) return { no: unknown[0]!.no, path };
  for (const [key, inner] of Object.entries(value)) {
    if (key === "$typeName" || key === "$unknown") continue;
    // A oneof is `{ case, value }`: its value sits under the case's name.
    const name = key === "value" && typeof (value as { case?: unknown }).case === "string" ? (value as { case: string }).case : key;
    const found = unknownFieldIn(inner, path === "" ? name : `${path}.${name}`);
    if (found !== undefined) return found;
  }
  return undefined;
}
