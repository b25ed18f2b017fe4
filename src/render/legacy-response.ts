import type { DescField, DescMessage, Message } from "@bufbuild/protobuf";
import { ScalarType } from "@bufbuild/protobuf";
import { fourDigits } from "../contract/error-codes.ts";
import { legacyKeyOfField, legacyLayouts, type LegacyStatusKey } from "../contract/legacy-layout.ts";
import type { Outcome } from "../core/gateway.ts";
import type { StatusBlock } from "../gen/gateway/catalogue/v1/status_pb.js";
import { PhpFloat, PhpFragment, type PhpMap, type PhpValue } from "./php-value.ts";

type Plan = readonly { readonly key: string; readonly read: (message: Record<string, unknown>) => PhpValue }[];

const plans = new Map<DescMessage, Plan>();

function scalar(type: ScalarType, v: unknown): PhpValue {
  switch (type) {
    case ScalarType.DOUBLE:
    case ScalarType.FLOAT:
      return new PhpFloat(v as number);
    case ScalarType.BOOL:
      return v as boolean;
    case ScalarType.STRING:
      return v as string;
    case ScalarType.BYTES:
      return Buffer.from(v as Uint8Array).toString("latin1");
    default:
      return Number(v);
  }
}

function fieldReader(field: DescField): (message: Record<string, unknown>) => PhpValue {
  const name = field.localName;
  switch (field.fieldKind) {
    case "scalar":
      if (field.presence === 1 /* EXPLICIT: proto3 `optional` */) {
        return (m) => (m[name] === undefined ? null : scalar(field.scalar, m[name]));
      }
      return (m) => scalar(field.scalar, m[name]);
    case "enum":
      return (m) => m[name] as number;
    case "message": {
      const desc = field.message;
      return (m) => (m[name] === undefined ? new Map() : messageValue(desc, m[name] as Message));
    }
    case "list":
      if (field.listKind === "message") {
        const desc = field.message;
        return (m) => (m[name] as Message[]).map((e) => messageValue(desc, e));
      }
      if (field.listKind === "enum") return (m) => [...(m[name] as number[])];
      return (m) => (m[name] as unknown[]).map((e) => scalar(field.scalar, e));
    case "map": {
      const toValue =
        field.mapKind === "message"
          ? (v: unknown) => messageValue(field.message, v as Message)
          : field.mapKind === "enum"
            ? (v: unknown) => v as number
            : (v: unknown) => scalar(field.scalar, v);
      return (m) => {
        const out: PhpMap = new Map();
        for (const [k, v] of Object.entries(m[name] as Record<string, unknown>)) out.set(k, toValue(v));
        return out;
      };
    }
  }
}

/** A protobuf message as the legacy PHP array: its fields in declaration order, under their legacy keys. */
export function messageValue(desc: DescMessage, message: Message): PhpMap {
  let plan = plans.get(desc);
  if (plan === undefined) {
    plan = desc.fields.map((f) => ({ key: legacyKeyOfField[f.name] ?? f.name, read: fieldReader(f) }));
    plans.set(desc, plan);
  }
  const out: PhpMap = new Map();
  const m = message as unknown as Record<string, unknown>;
  for (const { key, read } of plan) out.set(key, read(m));
  return out;
}

/** The PHP value of one key of the status block (every legacy format's, the one source of what each key holds). */
export function statusValue(key: LegacyStatusKey, s: StatusBlock): PhpValue {
  switch (key) {
    case "error_code":
      return fourDigits(s.errorCode);
    case "success":
      return s.success ?? 0;
    case "cache":
      return s.cache ? 1 : 0;
    case "execution_time":
      return s.executionTime.toFixed(3);
    case "call_args":
      return new Map(Object.entries(s.callArgs));
    case "_ddf":
      return s.ddf;
    case "secache_time":
      return Number(s.secacheTime);
    case "translate_time":
      return s.translateTime === 0 ? 0 : new PhpFloat(Math.round(s.translateTime * 1000) / 1000);
    case "language":
      return new Map<string, PhpValue>([
        ["current_lang", s.language?.currentLang ?? ""],
        ["source_lang", s.language?.sourceLang ?? ""],
      ]);
    case "error":
      return s.error;
    case "reason":
      return s.reason;
    case "api_info":
      return s.apiInfo;
    case "server_time":
      return s.serverTime;
    case "client_ip":
      return s.clientIp;
    case "api_type":
      return s.apiType;
    case "translate_language":
      return s.translateLanguage;
    case "translate_engine":
      return s.translateEngine;
    case "server_memory":
      return s.serverMemory;
    case "request_id":
      return s.requestId;
    case "last_id":
      return s.lastId;
    case "secache":
      return s.secache;
    case "secache_date":
      return s.secacheDate;
    case "translate_status":
      return s.translateStatus;
  }
}

const memoKey = "legacy-item";

/**
 * The `item` of a success. A cached answer keeps it in the entry's memo as a
 * fragment, so every later hit reuses the item's renderings.
 */
function itemValue(outcome: Extract<Outcome, { kind: "success" }>): PhpValue {
  const known = outcome.memo?.get(memoKey);
  if (known instanceof PhpFragment) return known;
  const { message, list } = outcome.operation.item;
  const item = outcome.item;
  const make = () => (list ? (item as Message[]).map((i) => messageValue(message, i)) : messageValue(message, item as Message));
  if (outcome.memo === undefined) return make();
  const memo = outcome.memo;
  // Made from the (cached) message whenever a rendering is first made, never kept itself.
  const fragment = new PhpFragment(make, (bytes) => memo.grew(bytes));
  memo.set(memoKey, fragment);
  return fragment;
}

/** An outcome's top-level keys, in wire order: `item` only on success. */
export function legacyKeys(outcome: Outcome): readonly (LegacyStatusKey | "item")[] {
  return outcome.kind === "success" ? outcome.operation.legacyLayout : legacyLayouts.error;
}

/** The PHP value under one of an outcome's keys (`legacyKeys`). */
export function legacyValue(outcome: Outcome, key: LegacyStatusKey | "item"): PhpValue {
  return key === "item" ? (outcome.kind === "success" ? itemValue(outcome) : null) : statusValue(key, outcome.status);
}

/** The legacy response of an outcome: `item` (on success) and the status block, keys in wire order. */
export function legacyResponse(outcome: Outcome): PhpMap {
  const out: PhpMap = new Map();
  for (const key of legacyKeys(outcome)) out.set(key, legacyValue(outcome, key));
  return out;
}
