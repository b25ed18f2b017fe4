/**
 * A PHP value, as legacy callers decode it: the one representation every
 * legacy format (json, jsonu, and later serialize, var_export, xml) renders.
 * - string, boolean, null: as in PHP;
 * - number: a PHP int (always a safe integer);
 * - PhpFloat: a PHP float;
 * - array: a PHP list;
 * - Map: a PHP array with keys, in order. An empty one is PHP's empty array,
 *   which json_encode writes as `[]`.
 */
export type PhpValue = string | number | boolean | null | PhpFloat | PhpValue[] | PhpMap;

export type PhpMap = Map<string, PhpValue>;

export class PhpFloat {
  readonly value: number;

  constructor(value: number) {
    this.value = value;
  }
}
