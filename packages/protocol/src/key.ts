/** Longest accepted idempotency key, in characters. */
export const MAX_KEY_LENGTH = 255

/** Why a header value is not an acceptable idempotency key. */
export type KeyErrorCode =
  | 'idempotency_key_missing'
  | 'idempotency_key_malformed'
  | 'idempotency_key_too_long'
  | 'idempotency_key_repeated'

/** The outcome of reading an `Idempotency-Key` header. */
export type ParsedKey = { ok: true; key: string } | { ok: false; code: KeyErrorCode; detail: string }

// Printable ASCII (0x20-0x7E) without the comma: Node joins repeated header lines with ", ", so a comma in a key
// would make a repeated header indistinguishable from one key.
function isKeyChar(code: number): boolean {
  return code >= 0x20 && code <= 0x7e && code !== 0x2c
}

/**
 * Checks a key's characters and length. Returns an error description, or `undefined` when the key is valid.
 * Valid keys are 1 to 255 printable ASCII characters without commas.
 */
export function keyProblem(key: string): { code: KeyErrorCode; detail: string } | undefined {
  if (key.length === 0) return { code: 'idempotency_key_malformed', detail: 'The key is empty.' }
  if (key.length > MAX_KEY_LENGTH) {
    return {
      code: 'idempotency_key_too_long',
      detail: `The key has ${key.length} characters; the limit is ${MAX_KEY_LENGTH}.`,
    }
  }
  for (let i = 0; i < key.length; i++) {
    const code = key.charCodeAt(i)
    if (!isKeyChar(code)) {
      return code === 0x2c
        ? {
            code: 'idempotency_key_malformed',
            detail: 'The key contains a comma; send exactly one Idempotency-Key header without commas.',
          }
        : { code: 'idempotency_key_malformed', detail: 'The key must be printable ASCII characters only.' }
    }
  }
  return undefined
}

/** True when `key` is 1 to 255 printable ASCII characters without commas. */
export function isValidKey(key: string): boolean {
  return keyProblem(key) === undefined
}

// Optional whitespace in HTTP is SP and HTAB only (RFC 9110, section 5.6.3). String#trim also drops U+00A0, which
// Node reads from the obs-text byte 0xA0, and so made "\xa0abc" and "abc" one key.
const OWS = /^[ \t]+|[ \t]+$/g

/**
 * Reads an `Idempotency-Key` header value. Accepts the bare form (`abc`) and the RFC 8941 string form (`"abc"`,
 * with `\"` and `\\` escapes). A repeated header (an array, or a value Node joined with a comma) is rejected.
 *
 * @example
 * parseIdempotencyKey('"8e03978e-40d5-43e8-bc93-6894a57f9324"') // { ok: true, key: '8e03978e-...' }
 * parseIdempotencyKey(undefined) // { ok: false, code: 'idempotency_key_missing', ... }
 */
export function parseIdempotencyKey(header: string | readonly string[] | undefined | null): ParsedKey {
  if (header === undefined || header === null) {
    return {
      ok: false,
      code: 'idempotency_key_missing',
      detail: 'Send an Idempotency-Key header with this request.',
    }
  }
  if (typeof header !== 'string') {
    if (header.length === 1) return parseIdempotencyKey(header[0])
    return {
      ok: false,
      code: 'idempotency_key_repeated',
      detail: 'Send exactly one Idempotency-Key header.',
    }
  }
  const value = header.replace(OWS, '')
  if (value.length === 0) {
    return { ok: false, code: 'idempotency_key_malformed', detail: 'The Idempotency-Key header is empty.' }
  }
  let key = value
  if (value.charCodeAt(0) === 0x22) {
    const unquoted = unquoteStructuredString(value)
    if (unquoted === undefined) {
      return {
        ok: false,
        code: value.includes(',') ? 'idempotency_key_repeated' : 'idempotency_key_malformed',
        detail: 'The quoted Idempotency-Key is not a valid RFC 8941 string.',
      }
    }
    key = unquoted
  } else if (value.includes(',')) {
    return {
      ok: false,
      code: 'idempotency_key_repeated',
      detail:
        'The Idempotency-Key contains a comma, which is how a repeated header arrives; send exactly one key.',
    }
  }
  const invalid = keyProblem(key)
  return invalid ? { ok: false, ...invalid } : { ok: true, key }
}

// RFC 8941 sf-string: DQUOTE *( unescaped / "\" ( DQUOTE / "\" ) ) DQUOTE.
function unquoteStructuredString(value: string): string | undefined {
  if (value.length < 2 || value.charCodeAt(value.length - 1) !== 0x22) return undefined
  let out = ''
  for (let i = 1; i < value.length - 1; i++) {
    const char = value[i]!
    if (char === '\\') {
      const next = value[i + 1]
      if (next !== '"' && next !== '\\') return undefined
      if (i + 1 === value.length - 1) return undefined
      out += next
      i++
    } else if (char === '"') {
      return undefined
    } else {
      out += char
    }
  }
  return out
}
