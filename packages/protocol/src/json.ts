/**
 * Canonical JSON (RFC 8785, JCS) and a strict JSON parser.
 *
 * Fingerprints must not depend on key order or on how a number was spelled, and two different requests must never
 * share a fingerprint. So bodies are parsed strictly (duplicate member names and integers beyond 2^53 are errors,
 * because either makes two different byte strings look equal after parsing) and serialised canonically. RFC 8785
 * takes I-JSON (RFC 7493) as input, which forbids lone surrogates: a string holding one has no canonical form (and
 * turns into U+FFFD, or fails, in any UTF-8 store), so both the parser and the serialiser refuse it.
 */

/** A JSON value. */
export type JsonValue = null | boolean | number | string | JsonValue[] | { [key: string]: JsonValue }

/** Thrown by {@link parseStrictJson} and {@link canonicalJson} for input that cannot be fingerprinted safely. */
export class JsonSyntaxError extends SyntaxError {
  override name = 'JsonSyntaxError' as const
  /** Offset in the text where the problem was found, when parsing. */
  readonly position: number | undefined
  constructor(message: string, position?: number) {
    super(position === undefined ? message : `${message} at position ${position}`)
    this.position = position
  }
}

const MAX_SAFE = Number.MAX_SAFE_INTEGER

const isSurrogate = (c: number): boolean => c >= 0xd800 && c <= 0xdfff

/** True when `text` holds a high surrogate at `i` and a low one right after it. */
function isPairAt(text: string, i: number): boolean {
  const high = text.charCodeAt(i)
  const low = text.charCodeAt(i + 1)
  return high >= 0xd800 && high <= 0xdbff && low >= 0xdc00 && low <= 0xdfff
}

/** True when `text` holds a UTF-16 surrogate that is not half of a high-low pair. */
function hasLoneSurrogate(text: string): boolean {
  for (let i = 0; i < text.length; i++) {
    if (!isSurrogate(text.charCodeAt(i))) continue
    if (!isPairAt(text, i)) return true
    i++
  }
  return false
}

const LONE_SURROGATE = 'Lone surrogate in a string; JSON text must be well-formed Unicode (I-JSON)'

/** Serialises a string or member name, refusing a lone surrogate (which `JSON.stringify` would escape as is). */
function canonicalString(text: string): string {
  if (hasLoneSurrogate(text)) throw new JsonSyntaxError(LONE_SURROGATE)
  return JSON.stringify(text)
}

function checkNumber(value: number, position?: number): void {
  if (!Number.isFinite(value)) throw new JsonSyntaxError('Numbers must be finite', position)
  if (Number.isInteger(value) && Math.abs(value) > MAX_SAFE) {
    throw new JsonSyntaxError('Integers beyond 2^53 lose precision; send them as strings', position)
  }
}

/** True when `keys` are sorted by UTF-16 code units, the order `sort()` gives strings. */
function inOrder(keys: readonly string[]): boolean {
  for (let i = 1; i < keys.length; i++) if (keys[i - 1]! > keys[i]!) return false
  return true
}

/**
 * Serialises a value as RFC 8785 canonical JSON: object members sorted by UTF-16 code units, no whitespace,
 * numbers and strings as ECMAScript `JSON.stringify` writes them. `undefined` members are omitted, as JSON does.
 *
 * @throws {JsonSyntaxError} for non-finite numbers, unsafe integers, strings or member names with a lone surrogate,
 * and values JSON cannot represent.
 * @example
 * canonicalJson({ b: 1, a: [true, null] }) // '{"a":[true,null],"b":1}'
 */
export function canonicalJson(value: unknown): string {
  switch (typeof value) {
    case 'string':
      return canonicalString(value)
    case 'number':
      checkNumber(value)
      return JSON.stringify(value)
    case 'boolean':
      return value ? 'true' : 'false'
    case 'object': {
      if (value === null) return 'null'
      if (Array.isArray(value)) {
        let out = '['
        for (let i = 0; i < value.length; i++) {
          if (i > 0) out += ','
          const item = value[i]
          out += item === undefined || typeof item === 'function' ? 'null' : canonicalJson(item)
        }
        return `${out}]`
      }
      const toJSON = (value as { toJSON?: () => unknown }).toJSON
      if (typeof toJSON === 'function') return canonicalJson(toJSON.call(value))
      const record = value as Record<string, unknown>
      const keys = Object.keys(record)
      // Most objects arrive with their members in order already; checking costs less than the sort's allocations.
      if (!inOrder(keys)) keys.sort()
      let out = '{'
      let first = true
      for (const key of keys) {
        const member = record[key]
        if (member === undefined || typeof member === 'function') continue
        if (!first) out += ','
        first = false
        out += `${canonicalString(key)}:${canonicalJson(member)}`
      }
      return `${out}}`
    }
    default:
      throw new JsonSyntaxError(`Cannot represent a ${typeof value} in JSON`)
  }
}

/**
 * Parses JSON text like `JSON.parse`, but rejects what would make a fingerprint ambiguous: duplicate member names in
 * one object, integers whose magnitude exceeds 2^53 - 1, and strings with a lone surrogate (escaped as `\ud800`, or
 * a raw unpaired code unit in `text`). The `__proto__` member name is kept as plain data.
 *
 * @throws {JsonSyntaxError} with the offending position.
 */
export function parseStrictJson(text: string): JsonValue {
  const parser = new StrictParser(text)
  parser.skipWhitespace()
  const value = parser.parseValue(0)
  parser.skipWhitespace()
  if (parser.pos !== text.length)
    throw new JsonSyntaxError('Unexpected data after the JSON value', parser.pos)
  return value
}

const MAX_DEPTH = 512
// `Object.hasOwn` is ES2022, which older React Native engines lack.
const hasOwn = Object.prototype.hasOwnProperty

class StrictParser {
  pos = 0
  constructor(private readonly text: string) {}

  skipWhitespace(): void {
    const text = this.text
    let pos = this.pos
    while (pos < text.length) {
      const c = text.charCodeAt(pos)
      if (c === 0x20 || c === 0x0a || c === 0x0d || c === 0x09) pos++
      else break
    }
    this.pos = pos
  }

  parseValue(depth: number): JsonValue {
    if (depth > MAX_DEPTH) throw new JsonSyntaxError('JSON is nested too deeply', this.pos)
    const c = this.text.charCodeAt(this.pos)
    switch (c) {
      case 0x7b:
        return this.parseObject(depth)
      case 0x5b:
        return this.parseArray(depth)
      case 0x22:
        return this.parseString()
      case 0x74:
        return this.literal('true', true)
      case 0x66:
        return this.literal('false', false)
      case 0x6e:
        return this.literal('null', null)
      default:
        if (c === 0x2d || (c >= 0x30 && c <= 0x39)) return this.parseNumber()
        throw new JsonSyntaxError(
          Number.isNaN(c)
            ? 'Unexpected end of JSON input'
            : `Unexpected character ${JSON.stringify(this.text[this.pos])}`,
          this.pos,
        )
    }
  }

  private literal<T extends JsonValue>(word: string, value: T): T {
    if (!this.text.startsWith(word, this.pos)) throw new JsonSyntaxError('Invalid literal', this.pos)
    this.pos += word.length
    return value
  }

  private parseObject(depth: number): JsonValue {
    const start = this.pos
    const result: Record<string, JsonValue> = {}
    if (this.opensEmpty(0x7d)) return result
    do {
      this.skipWhitespace()
      if (this.text.charCodeAt(this.pos) !== 0x22)
        throw new JsonSyntaxError('Expected a member name', this.pos)
      const keyPos = this.pos
      const key = this.parseString()
      if (hasOwn.call(result, key))
        throw new JsonSyntaxError(`Duplicate member name ${JSON.stringify(key)}`, keyPos)
      this.skipWhitespace()
      if (this.text.charCodeAt(this.pos) !== 0x3a) throw new JsonSyntaxError('Expected ":"', this.pos)
      this.pos++
      this.skipWhitespace()
      const value = this.parseValue(depth + 1)
      // "__proto__" is the one inherited accessor an assignment would call (it would change the prototype):
      // defineProperty keeps it as data. Every other name is a plain assignment, which V8 keeps fast.
      if (key === '__proto__')
        Object.defineProperty(result, key, { value, enumerable: true, writable: true, configurable: true })
      else result[key] = value
    } while (this.continues(0x7d, start))
    return result
  }

  private parseArray(depth: number): JsonValue {
    const result: JsonValue[] = []
    if (this.opensEmpty(0x5d)) return result
    do {
      this.skipWhitespace()
      result.push(this.parseValue(depth + 1))
    } while (this.continues(0x5d))
    return result
  }

  // Steps over the `{` or `[` at `pos` and the whitespace after it; true (and steps over `close` too) when the
  // object or array is empty.
  private opensEmpty(close: number): boolean {
    this.pos++
    this.skipWhitespace()
    if (this.text.charCodeAt(this.pos) !== close) return false
    this.pos++
    return true
  }

  // After a member or an element: true on `,` (another one follows), false on `close` (the end). An object that
  // ends with the text is unterminated (`objectStart` says where it started).
  private continues(close: number, objectStart?: number): boolean {
    this.skipWhitespace()
    const c = this.text.charCodeAt(this.pos)
    this.pos++
    if (c === 0x2c) return true
    if (c === close) return false
    throw new JsonSyntaxError(
      Number.isNaN(c) && objectStart !== undefined
        ? `Unterminated object starting at ${objectStart}`
        : `Expected "," or "${String.fromCharCode(close)}"`,
      this.pos - 1,
    )
  }

  private parseString(): string {
    const text = this.text
    const start = this.pos + 1
    let pos = start
    // Fast path: no escapes.
    while (pos < text.length) {
      const c = text.charCodeAt(pos)
      if (c === 0x22) {
        this.pos = pos + 1
        return text.slice(start, pos)
      }
      if (c === 0x5c) break
      if (c < 0x20) throw new JsonSyntaxError('Control character in string', pos)
      // A raw surrogate (from a caller's string; decoded UTF-8 never holds one) is fine only as a pair's high half.
      if (isSurrogate(c)) {
        if (!isPairAt(text, pos)) throw new JsonSyntaxError(LONE_SURROGATE, pos)
        pos++
      }
      pos++
    }
    // Slow path: let JSON.parse decode escapes once the end of the string is found.
    while (pos < text.length) {
      const c = text.charCodeAt(pos)
      if (c === 0x5c) pos += 2
      else if (c === 0x22) {
        this.pos = pos + 1
        let decoded: string
        try {
          decoded = JSON.parse(text.slice(start - 1, pos + 1)) as string
        } catch {
          throw new JsonSyntaxError('Invalid escape in string', start - 1)
        }
        // Escaped surrogates (`\ud800`) pair up, or not, only once decoded.
        if (hasLoneSurrogate(decoded)) throw new JsonSyntaxError(LONE_SURROGATE, start - 1)
        return decoded
      } else if (c < 0x20) throw new JsonSyntaxError('Control character in string', pos)
      else if (!isSurrogate(c)) pos++
      else if (isPairAt(text, pos)) pos += 2
      else throw new JsonSyntaxError(LONE_SURROGATE, pos)
    }
    throw new JsonSyntaxError('Unterminated string', start - 1)
  }

  private parseNumber(): number {
    const text = this.text
    const start = this.pos
    let pos = start
    if (text.charCodeAt(pos) === 0x2d) pos++
    const intStart = pos
    while (pos < text.length && isDigit(text.charCodeAt(pos))) pos++
    if (pos === intStart) throw new JsonSyntaxError('Invalid number', start)
    if (text.charCodeAt(intStart) === 0x30 && pos - intStart > 1)
      throw new JsonSyntaxError('Leading zero', start)
    if (text.charCodeAt(pos) === 0x2e) {
      pos++
      const fracStart = pos
      while (pos < text.length && isDigit(text.charCodeAt(pos))) pos++
      if (pos === fracStart) throw new JsonSyntaxError('Invalid number', start)
    }
    const e = text.charCodeAt(pos)
    if (e === 0x65 || e === 0x45) {
      pos++
      const sign = text.charCodeAt(pos)
      if (sign === 0x2b || sign === 0x2d) pos++
      const expStart = pos
      while (pos < text.length && isDigit(text.charCodeAt(pos))) pos++
      if (pos === expStart) throw new JsonSyntaxError('Invalid number', start)
    }
    this.pos = pos
    const value = Number(text.slice(start, pos))
    checkNumber(value, start)
    return value
  }
}

function isDigit(c: number): boolean {
  return c >= 0x30 && c <= 0x39
}
