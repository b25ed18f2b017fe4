import { phpJsonEncode } from "./php-json.ts";
import { phpSerialize } from "./php-serialize.ts";
import type { PhpMap } from "./php-value.ts";
import { phpVarExport } from "./php-var-export.ts";
import { legacyXml } from "./legacy-xml.ts";

export interface LegacyFormat {
  readonly contentType: string;
  render(response: PhpMap): string;
}

/** Every legacy `result_type`, each rendered from the same PHP value of the response. */
export const legacyFormats = {
  json: { contentType: "application/json; charset=utf-8", render: (r) => phpJsonEncode(r, { unescapedUnicode: false }) },
  jsonu: { contentType: "application/json; charset=utf-8", render: (r) => phpJsonEncode(r, { unescapedUnicode: true }) },
  xml: { contentType: "application/xml; charset=utf-8", render: legacyXml },
  serialize: { contentType: "text/plain; charset=utf-8", render: phpSerialize },
  var_export: { contentType: "text/plain; charset=utf-8", render: phpVarExport },
} as const satisfies Record<string, LegacyFormat>;

export type LegacyFormatName = keyof typeof legacyFormats;

export function isLegacyFormat(name: string): name is LegacyFormatName {
  return Object.hasOwn(legacyFormats, name);
}
