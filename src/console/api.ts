// The console's only way to the gateway: Connect-Web transports and the
// generated service descriptors, exactly as any browser client would use them.
import { Code, ConnectError, createClient, type Client, type Interceptor } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-web";
import { AdminService } from "../gen/gateway/admin/v1/admin_pb.js";

const tokenKey = "gateway-console-admin-token";

/** The admin token lives in this tab's session storage only: never in a URL, gone when the tab closes. */
export const session = {
  token: (): string | null => sessionStorage.getItem(tokenKey),
  signIn: (token: string): void => sessionStorage.setItem(tokenKey, token),
  signOut: (): void => sessionStorage.removeItem(tokenKey),
};

/** Adds `authorization: Bearer <admin token>` to every admin call. */
const bearer = (token: string): Interceptor => (next) => (req) => {
  req.header.set("authorization", `Bearer ${token}`);
  return next(req);
};

export type AdminClient = Client<typeof AdminService>;

export function adminClient(token: string): AdminClient {
  return createClient(AdminService, createConnectTransport({ baseUrl: location.origin, interceptors: [bearer(token)] }));
}

/** An error of an admin call in words an operator can act on. */
export function inWords(e: unknown): string {
  const err = ConnectError.from(e);
  switch (err.code) {
    case Code.Unauthenticated:
      return err.rawMessage.includes("GATEWAY_ADMIN_TOKEN")
        ? "The admin API is off on this gateway: start it with GATEWAY_ADMIN_TOKEN set."
        : "The admin token is not valid. Check it and sign in again.";
    case Code.NotFound:
      return `Not found: ${err.rawMessage}`;
    case Code.InvalidArgument:
      return `Not accepted: ${err.rawMessage}`;
    case Code.ResourceExhausted:
      return `Too many failed sign-ins from this address: ${err.rawMessage}`;
    case Code.Unavailable:
      return err.rawMessage.includes("fetch") || err.rawMessage.includes("Failed") ? "The gateway cannot be reached." : `The gateway is unavailable: ${err.rawMessage}`;
    default:
      return `${Code[err.code]}: ${err.rawMessage}`;
  }
}

/** The four-digit code of a status block, as legacy callers see it. */
export const fourDigits = (code: number) => String(code).padStart(4, "0");

export function isUnauthenticated(e: unknown): boolean {
  return ConnectError.from(e).code === Code.Unauthenticated;
}

/** The operation table as the gateway serves it (/console/gateway.json). */
export interface OperationInfo {
  readonly id: string;
  readonly catalogue: string;
  readonly apiName: string;
  readonly path: string;
  readonly rpcPath: string;
  readonly service: string;
  readonly method: string;
  readonly args: readonly { readonly name: string; readonly required: boolean; readonly accepts: string | readonly string[]; readonly maxLength: number }[];
}

/** What the console reads of the gateway it is served by. */
export interface GatewayInfo {
  readonly operations: readonly OperationInfo[];
  /** The legacy result_type values. */
  readonly resultTypes: readonly string[];
}

export async function loadGatewayInfo(): Promise<GatewayInfo> {
  const res = await fetch("gateway.json");
  if (!res.ok) throw new Error(`gateway.json: HTTP ${res.status}`);
  return (await res.json()) as GatewayInfo;
}
