// Explorer: pick an operation, fill its arguments, pick a transport (Connect
// JSON, Connect binary, gRPC-Web) or a legacy result_type, and call it as one
// account. The page never holds the account's secret: each call is signed by
// the gateway's AdminService.SignCall (the signing-endpoint pattern of the
// README), and the signature is good for that one call.
import { create, toJson, toJsonString, type DescMessage, type DescMethod, type DescService, type Message } from "@bufbuild/protobuf";
import { Code, ConnectError, createClient, type Transport } from "@connectrpc/connect";
import { createConnectTransport, createGrpcWebTransport } from "@connectrpc/connect-web";
import { accountPicker } from "./account-picker.ts";
import { RetailService } from "../gen/gateway/catalogue/v1/retail_pb.js";
import { StatusBlockSchema } from "../gen/gateway/catalogue/v1/status_pb.js";
import { WholesaleService } from "../gen/gateway/catalogue/v1/wholesale_pb.js";
import { fourDigits, inWords, isUnauthenticated, type OperationInfo } from "./api.ts";
import { field, h, notice } from "./dom.ts";
import type { Shell } from "./main.ts";

const services: readonly DescService[] = [RetailService, WholesaleService];
const transports = {
  "connect-json": { label: "Connect, JSON", make: () => createConnectTransport({ baseUrl: location.origin }), protocol: "connect", binary: false },
  "connect-binary": { label: "Connect, binary", make: () => createConnectTransport({ baseUrl: location.origin, useBinaryFormat: true }), protocol: "connect", binary: true },
  "grpc-web": { label: "gRPC-Web", make: () => createGrpcWebTransport({ baseUrl: location.origin }), protocol: "grpcweb", binary: true },
} as const satisfies Record<string, { label: string; make: () => Transport; protocol: string; binary: boolean }>;
type RpcTransport = keyof typeof transports;

/** Shell quoting for the commands shown: single quotes, with any single quote closed and escaped. */
const q = (s: string) => `'${s.replaceAll("'", "'\\''")}'`;

function rpcMethod(op: OperationInfo): { service: DescService; method: DescMethod } {
  const service = services.find((s) => s.typeName === op.service);
  const method = service?.methods.find((m) => m.name === op.method);
  if (service === undefined || method === undefined) throw new Error(`this console does not know ${op.rpcPath}`);
  return { service, method };
}

/** The request message from the legacy-named arguments and options (cache, lang), as the RPC takes them. */
function requestMessage(input: DescMessage, args: Record<string, string>): Message {
  const init: Record<string, unknown> = {};
  for (const [name, value] of Object.entries(args)) {
    if (value === "") continue;
    const f = input.fields.find((x) => x.name === name);
    if (f === undefined) continue;
    if (f.fieldKind === "enum") {
      const prefix = f.enum.values[0]!.name.replace(/UNSPECIFIED$/, "");
      const v = f.enum.values.find((e) => e.name === `${prefix}${value.toUpperCase()}`);
      if (v !== undefined) init[f.localName] = v.number;
    } else init[f.localName] = value;
  }
  return create(input, init as never);
}

interface CallReport {
  readonly request: string;
  readonly code: string;
  readonly outcome: string;
  readonly status?: unknown;
  readonly item?: unknown;
  readonly body?: string;
  readonly ms: number;
  readonly commands: string[];
}

export async function explorerView(main: HTMLElement, shell: Shell): Promise<void> {
  const picker = await accountPicker(shell, { name: "account", required: true });
  const account = picker.select;
  const opSelect = h("select", { name: "operation" }, ...shell.operations.map((op) => h("option", { value: op.id }, op.id)));
  const transport = h(
    "select",
    { name: "transport" },
    ...Object.entries(transports).map(([k, t]) => h("option", { value: k }, t.label)),
    ...shell.resultTypes.map((rt) => h("option", { value: `legacy:${rt}` }, `Legacy query string, result_type=${rt}`)),
  );
  const cache = h("select", { name: "cache" }, h("option", { value: "" }, "default (yes)"), h("option", { value: "yes" }, "yes"), h("option", { value: "no" }, "no"));
  const lang = h("select", { name: "lang" }, h("option", { value: "" }, "default (cn)"), h("option", { value: "cn" }, "cn"), h("option", { value: "en" }, "en"), h("option", { value: "ru" }, "ru"));
  const argBox = h("div", { class: "grid" });
  const result = h("div", { "aria-live": "polite" });
  let argInputs: { name: string; input: HTMLInputElement }[] = [];

  const renderArgs = () => {
    const op = shell.operations.find((o) => o.id === opSelect.value)!;
    argInputs = op.args.map((a) => ({
      name: a.name,
      input: h("input", { name: `arg:${a.name}`, required: a.required, maxlength: a.maxLength, ...(Array.isArray(a.accepts) ? { placeholder: a.accepts.map((v) => v || '""').join(" | ") } : a.accepts === "numeric" ? { inputmode: "numeric" } : {}) }),
    }));
    argBox.replaceChildren(...argInputs.map(({ name, input }) => field(`${name}${input.required ? " (required)" : ""}`, input)));
  };
  opSelect.addEventListener("change", renderArgs);
  renderArgs();

  const send = async (): Promise<CallReport> => {
    const op = shell.operations.find((o) => o.id === opSelect.value)!;
    const key = account.value;
    const args: Record<string, string> = {};
    for (const { name, input } of argInputs) if (input.value.trim() !== "") args[name] = input.value.trim();
    if (cache.value) args.cache = cache.value;
    if (lang.value) args.lang = lang.value;
    const base = location.origin;
    if (transport.value.startsWith("legacy:")) {
      const params = { ...args, result_type: transport.value.slice("legacy:".length) };
      const signed = await shell.client.signCall({ key, method: "GET", path: op.path, params });
      const url = `${base}${op.path}?${new URLSearchParams({ key, ...params, timestamp: String(signed.timestamp), nonceStr: signed.nonce, signature: signed.signature })}`;
      const started = performance.now();
      const res = await fetch(url);
      const body = await res.text();
      const ms = performance.now() - started;
      let code = "";
      let status: unknown;
      const json = /json/.test(res.headers.get("content-type") ?? "") ? (JSON.parse(body) as Record<string, unknown>) : undefined;
      if (json !== undefined) {
        code = String(json.error_code ?? "");
        status = Object.fromEntries(Object.entries(json).filter(([k]) => k !== "item"));
      } else code = /error_code[^0-9]*(\d{4})/.exec(body)?.[1] ?? "";
      return { request: `GET ${url}`, code, outcome: `HTTP ${res.status}`, status, body: body.length > 20_000 ? `${body.slice(0, 20_000)}… (${body.length} characters)` : body, ms, commands: [`curl ${q(url)}`] };
    }
    const t = transports[transport.value as RpcTransport];
    const { service, method } = rpcMethod(op);
    const request = requestMessage(method.input, args);
    const signed = await shell.client.signCall({ key, method: "RPC", path: op.rpcPath, params: args });
    const headers = { "x-api-key": key, "x-api-timestamp": String(signed.timestamp), "x-api-nonce": signed.nonce, "x-api-signature": signed.signature };
    const requestJson = toJsonString(method.input, request);
    const hflags = Object.entries(headers).map(([k, v]) => `-H ${q(`${k}: ${v}`)}`).join(" ");
    const commands = [
      ...(transport.value === "connect-json" ? [`curl -H 'content-type: application/json' ${hflags} -d ${q(requestJson)} ${base}${op.rpcPath}`] : []),
      `npx buf curl --protocol ${t.protocol} ${hflags} -d ${q(requestJson)} ${base}${op.rpcPath}`,
    ];
    const client = createClient(service, t.make()) as unknown as Record<string, (req: Message, opts: { headers: Record<string, string> }) => Promise<Message & { status?: Message; item?: Message }>>;
    const started = performance.now();
    try {
      const res = await client[method.localName]!(request, { headers });
      const ms = performance.now() - started;
      const json = toJson(method.output, res as never) as { status?: unknown; item?: unknown };
      const code = fourDigits((res.status as unknown as { errorCode?: number } | undefined)?.errorCode ?? 0);
      return { request: `${t.label} ${op.rpcPath} ${requestJson}`, code, outcome: "ok", status: json.status, item: json.item, ms, commands };
    } catch (e) {
      const ms = performance.now() - started;
      const err = ConnectError.from(e);
      const block = err.findDetails(StatusBlockSchema)[0];
      return {
        request: `${t.label} ${op.rpcPath} ${requestJson}`,
        code: block ? fourDigits(block.errorCode) : "",
        outcome: `${Code[err.code]}: ${err.rawMessage}`,
        ...(block ? { status: toJson(StatusBlockSchema, block) } : {}),
        ms,
        commands,
      };
    }
  };

  const form = h(
    "form",
    {
      class: "card",
      "aria-label": "Explorer call",
      onsubmit: async (e: Event) => {
        e.preventDefault();
        if (account.value === "") return result.replaceChildren(notice("error", "Create an account first."));
        result.replaceChildren(notice("ok", "Calling…"));
        let r: CallReport;
        try {
          r = await send();
        } catch (err) {
          if (isUnauthenticated(err)) return shell.signedOut(inWords(err));
          return result.replaceChildren(notice("error", err instanceof ConnectError ? inWords(err) : (err as Error).message));
        }
        result.replaceChildren(
          h(
            "section",
            { class: "card", "aria-label": "Call result" },
            h("h2", {}, "Result ", h("span", { class: `badge ${r.code === "0000" ? "active" : "stopped"}`, "data-testid": "result-code" }, r.code || "no code"), " ", h("span", { class: "muted" }, `${r.ms.toFixed(1)} ms · ${r.outcome}`)),
            h("h3", {}, "Request"),
            h("pre", { "data-testid": "result-request" }, r.request),
            r.status !== undefined && h("h3", {}, "Status block"),
            r.status !== undefined && h("pre", { "data-testid": "result-status" }, JSON.stringify(r.status, null, 2)),
            r.item !== undefined && h("h3", {}, "Item"),
            r.item !== undefined && h("pre", { class: "item" }, JSON.stringify(r.item, null, 2)),
            r.body !== undefined && h("h3", {}, "Body"),
            r.body !== undefined && h("pre", { class: "item" }, r.body),
            h("h3", {}, "The same call from a shell"),
            ...r.commands.map((c) => h("pre", { class: "command" }, c)),
            h("p", { class: "muted" }, "Its nonce is spent by this call: to run it again, sign it anew (AdminService.SignCall, or your own signing endpoint)."),
          ),
        );
      },
    },
    h("div", { class: "grid" }, field("Operation", opSelect), field("Transport", transport), ...picker.fields, field("cache", cache), field("lang", lang)),
    argBox,
    h("button", { type: "submit" }, "Send"),
  );
  main.replaceChildren(h("h1", {}, "Explorer"), h("p", { class: "muted" }, "Calls are signed by the gateway for the chosen account (AdminService.SignCall); this page never sees an account's secret."), form, result);
}
