// Property-based tests of the protocol's parsers and serialisers, over random inputs from a fixed seed (so a run is
// reproducible; ONCELY_PROPERTY_SEED=<n> tries another, and a failure names the seed that found it).
import { isDeepStrictEqual } from 'node:util'
import fc from 'fast-check'
import { describe, expect, it } from 'vitest'
import {
  canonicalJson,
  formatRetryAfter,
  JsonSyntaxError,
  type KeyErrorCode,
  parseIdempotencyKey,
  parseRetryAfter,
  parseStrictJson,
  requestFingerprint,
} from '../src/index.js'
import { isValidKey, MAX_KEY_LENGTH } from '../src/key.js'

const SEED = seedFromEnv(process.env.ONCELY_PROPERTY_SEED)

function seedFromEnv(text: string | undefined): number {
  if (text === undefined || text === '') return 20_261_201
  const seed = Number(text)
  if (!Number.isSafeInteger(seed)) throw new Error(`ONCELY_PROPERTY_SEED must be an integer, got "${text}"`)
  return seed
}

/** `fc.assert` from the suite's seed; a failure says how to run it again (fast-check adds the shrunk case). */
function check<Ts>(property: fc.IRawProperty<Ts>, numRuns: number): void {
  try {
    fc.assert(property, { seed: SEED, numRuns })
  } catch (error) {
    throw new Error(
      `${(error as Error).message}\n\nReproduce with ONCELY_PROPERTY_SEED=${SEED} (the suite's seed).`,
      { cause: error },
    )
  }
}

/** `count` values drawn from `arbitrary` with the suite's seed. */
const sample = <T>(arbitrary: fc.Arbitrary<T>, count: number): T[] =>
  fc.sample(arbitrary, { seed: SEED, numRuns: count })

// --- JSON values and their many spellings --------------------------------------------------------------------------

type Json = null | boolean | number | string | Json[] | { [name: string]: Json }

/** Finite numbers JSON holds exactly: integers within 2^53, and any other finite double. */
const jsonNumber = fc.oneof(
  fc.integer({ min: -1_000, max: 1_000 }),
  fc.maxSafeInteger(),
  fc
    .double({ noNaN: true, noDefaultInfinity: true })
    .filter((n) => !Number.isInteger(n) || Number.isSafeInteger(n)),
)

/** Well-formed strings: any code point (escapes, controls, astral pairs), and short ASCII ones that often repeat. */
const jsonString = fc.oneof(
  fc.string({ unit: 'binary', maxLength: 8 }),
  fc.string({
    unit: fc.constantFrom('a', 'b', '"', '\\', '/', '\n', '\u0000', '\u2028', 'é', '😀'),
    maxLength: 4,
  }),
)

function jsonValueOf(scalar: {
  number: fc.Arbitrary<number>
  string: fc.Arbitrary<string>
}): fc.Arbitrary<Json> {
  return fc.letrec<{ value: Json }>((tie) => ({
    value: fc.oneof(
      { depthSize: 'small', withCrossShrink: true },
      fc.constant(null),
      fc.boolean(),
      scalar.number,
      scalar.string,
      fc.array(tie('value'), { maxLength: 4 }),
      fc.dictionary(scalar.string, tie('value'), { maxKeys: 4 }),
    ),
  })).value
}

const jsonValue = jsonValueOf({ number: jsonNumber, string: jsonString })

/** A tiny domain, where random values are often equal or nearly so: what a collision would need. */
const tightValue = jsonValueOf({
  number: fc.constantFrom(0, -0, 1, -1, 0.5, 100, 2.5e-300, 1e-7),
  string: fc.constantFrom('', 'a', 'b', 'ab', '1', 'null', '\u00e9', 'e\u0301'),
})

/** -0 is written `0` (RFC 8785), so values are compared with it read as 0. */
function normalise(value: Json): Json {
  if (Object.is(value, -0)) return 0
  if (Array.isArray(value)) return value.map(normalise)
  if (typeof value !== 'object' || value === null) return value
  const out: Record<string, Json> = {}
  for (const [name, member] of Object.entries(value)) {
    Object.defineProperty(out, name, {
      value: normalise(member),
      enumerable: true,
      writable: true,
      configurable: true,
    })
  }
  return out
}

/** A deterministic stream of choices, so one seed from fast-check picks one spelling. */
function chooser(seed: number) {
  let state = seed >>> 0 || 1
  return <T>(options: readonly T[]): T => {
    state ^= state << 13
    state ^= state >>> 17
    state ^= state << 5
    return options[(state >>> 0) % options.length]!
  }
}

const SHORT_ESCAPES: Record<string, string> = {
  '"': '\\"',
  '\\': '\\\\',
  '/': '\\/',
  '\b': '\\b',
  '\f': '\\f',
  '\n': '\\n',
  '\r': '\\r',
  '\t': '\\t',
}

const hex4 = (code: number, upper: boolean) => {
  const digits = code.toString(16).padStart(4, '0')
  return `\\u${upper ? digits.toUpperCase() : digits}`
}

/** Another valid spelling of a string: each character as itself, a short escape or a \u escape, at random. */
function spellString(text: string, pick: ReturnType<typeof chooser>): string {
  let out = '"'
  for (let i = 0; i < text.length; i++) {
    const code = text.charCodeAt(i)
    const isPair = code >= 0xd800 && code <= 0xdbff && i + 1 < text.length
    const unit = isPair ? text.slice(i, i + 2) : text[i]!
    if (isPair) i++
    const mustEscape = unit === '"' || unit === '\\' || code < 0x20
    const forms: string[] = []
    if (!mustEscape) forms.push(unit)
    if (SHORT_ESCAPES[unit]) forms.push(SHORT_ESCAPES[unit])
    const units = [...unit].flatMap((c) =>
      c.length === 2 ? [c.charCodeAt(0), c.charCodeAt(1)] : [c.charCodeAt(0)],
    )
    forms.push(units.map((u) => hex4(u, false)).join(''), units.map((u) => hex4(u, true)).join(''))
    out += pick(forms)
  }
  return `${out}"`
}

/** Another valid spelling of a number that reads back as the same double: exponents, trailing zeros, `E+0`. */
function spellNumber(value: number, pick: ReturnType<typeof chooser>): string {
  const plain = Object.is(value, -0) ? '-0' : String(value)
  const forms = [plain, value.toExponential(), value.toExponential().toUpperCase()]
  if (!plain.includes('e'))
    forms.push(plain.includes('.') ? `${plain}00` : `${plain}.0`, `${plain}E+0`, `${plain}e-0`)
  if (Number.isInteger(value) && value !== 0 && value % 100 === 0 && Math.abs(value) < 1e21)
    forms.push(`${value / 100}e2`)
  if (Number.isInteger(value) && value !== 0 && Math.abs(value) < 1e15) forms.push(`${value}000e-3`)
  return pick(forms)
}

/** The same value written in another valid way: member order, whitespace, number and string spellings. */
function respell(value: Json, seed: number): string {
  const pick = chooser(seed)
  const ws = () => pick(['', '', ' ', '\n', '\t', '\r\n', '  '])
  const write = (v: Json): string => {
    if (v === null) return 'null'
    if (typeof v === 'boolean') return v ? 'true' : 'false'
    if (typeof v === 'number') return spellNumber(v, pick)
    if (typeof v === 'string') return spellString(v, pick)
    if (Array.isArray(v)) return `[${ws()}${v.map((item) => `${write(item)}${ws()}`).join(`,${ws()}`)}]`
    const entries = Object.entries(v)
    for (let i = entries.length - 1; i > 0; i--) {
      const j = pick(Array.from({ length: i + 1 }, (_, k) => k))
      ;[entries[i], entries[j]] = [entries[j]!, entries[i]!]
    }
    return `{${ws()}${entries.map(([name, member]) => `${spellString(name, pick)}${ws()}:${ws()}${write(member)}${ws()}`).join(`,${ws()}`)}}`
  }
  return `${ws()}${write(value)}${ws()}`
}

const fingerprint = (body: unknown) => requestFingerprint({ method: 'POST', route: '/v1/payments', body })

describe('canonical JSON and fingerprints', () => {
  it('knows the spellings the respeller uses (a respeller that wrote one form only would prove nothing)', () => {
    expect(parseStrictJson(String.raw`["\u0041", "\/", 1e2, 100.0, 100, 10000e-2, -0.0E+0]`)).toEqual([
      'A',
      '/',
      100,
      100,
      100,
      100,
      -0,
    ])
    expect(canonicalJson(parseStrictJson(String.raw`{ "b" : "\u00E9" , "a":1E2 }`))).toBe('{"a":100,"b":"é"}')
    const spellings = new Set(
      sample(fc.integer(), 50).map((seed) => respell({ b: [100, 'A/'], a: 0.5 }, seed)),
    )
    expect(spellings.size).toBeGreaterThan(20)
  })

  it('gives every spelling of a value one canonical form and one fingerprint', () => {
    check(
      fc.property(jsonValue, fc.integer(), (value, seed) => {
        const text = respell(value, seed)
        const parsed = parseStrictJson(text)
        expect(canonicalJson(parsed)).toBe(canonicalJson(value))
        expect(fingerprint(parsed)).toBe(fingerprint(value))
      }),
      1_000,
    )
  })

  it('writes text that JSON.parse reads back as the same value, and that is its own canonical form', () => {
    check(
      fc.property(jsonValue, (value) => {
        const canonical = canonicalJson(value)
        expect(JSON.parse(canonical)).toEqual(normalise(value))
        expect(canonicalJson(parseStrictJson(canonical))).toBe(canonical)
      }),
      1_000,
    )
  })

  it('never gives two different values one canonical form or one fingerprint, in a large sample', () => {
    for (const [arbitrary, count] of [
      [tightValue, 3_000],
      [jsonValue, 3_000],
    ] as const) {
      const byCanonical = new Map<string, Json>()
      const byFingerprint = new Map<string, string>()
      let distinct = 0
      for (const value of sample(arbitrary, count)) {
        const canonical = canonicalJson(value)
        const seen = byCanonical.get(canonical)
        if (seen === undefined) {
          byCanonical.set(canonical, normalise(value))
          distinct++
        } else if (!isDeepStrictEqual(seen, normalise(value))) {
          expect.fail(`${JSON.stringify(seen)} and ${JSON.stringify(value)} share ${canonical}`)
        }
        const print = fingerprint(value)
        const owner = byFingerprint.get(print)
        if (owner !== undefined && owner !== canonical)
          expect.fail(`${owner} and ${canonical} share a fingerprint`)
        byFingerprint.set(print, canonical)
      }
      // Distinct values and distinct forms are one and the same count (and the sample did repeat itself).
      expect(byFingerprint.size).toBe(distinct)
      expect(distinct).toBeGreaterThan(100)
      if (arbitrary === tightValue) expect(distinct).toBeLessThan(count)
    }
  })

  it('refuses a lone surrogate anywhere in a string or a member name, parsing and serialising alike', () => {
    const lone = fc.integer({ min: 0xd800, max: 0xdfff }).map((code) => String.fromCharCode(code))
    const withLone = fc
      .tuple(jsonString, lone, jsonString)
      .map(([before, unit, after]) => `${before}${unit}${after}`)
      .filter((text) => /[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/.test(text))
    check(
      fc.property(withLone, jsonValue, fc.boolean(), (text, value, asName) => {
        const document = asName ? { [text]: value } : [value, text]
        expect(() => canonicalJson(document)).toThrow(JsonSyntaxError)
        // JSON.stringify escapes the lone unit as \uXXXX; the raw text keeps it as a code unit.
        const texts = [JSON.stringify(document)]
        if (![...text].some((c) => c === '"' || c === '\\' || c < ' '))
          texts.push(asName ? `{"${text}":1}` : `["${text}"]`)
        for (const json of texts) expect(() => parseStrictJson(json)).toThrow(/Lone surrogate/)
      }),
      1_000,
    )
  })

  it('parses valid JSON without duplicate members exactly as JSON.parse does', () => {
    check(
      fc.property(jsonValue, fc.integer(), fc.constantFrom(undefined, 0, 2, '\t'), (value, seed, indent) => {
        for (const text of [JSON.stringify(value, null, indent), respell(value, seed)]) {
          expect(parseStrictJson(text)).toEqual(JSON.parse(text))
        }
      }),
      1_000,
    )
  })

  it('on any text, agrees with JSON.parse or refuses with a JsonSyntaxError naming one of its own rules', () => {
    const token = fc.constantFrom(
      ...['{', '}', '[', ']', ',', ':', ' ', '"', '\\', 'u', 'd800', 'dc00', '0041', 'a', '"a"', '"b"'],
      ...['1', '0', '-', '.', 'e', '+', '9007199254740993', '1e400', 'true', 'nul', 'null', '\n', '\u0001'],
    )
    const jsonish = fc.oneof(
      fc.array(token, { maxLength: 16 }).map((tokens) => tokens.join('')),
      fc.tuple(jsonValue, fc.integer(), fc.nat(), fc.nat()).map(([value, seed, at, cut]) => {
        const text = respell(value, seed)
        const i = at % (text.length + 1)
        return text.slice(0, i) + text.slice(i + (cut % 3))
      }),
      fc.string({ unit: 'binary', maxLength: 12 }),
    )
    const ownRules = /Duplicate member name|2\^53|Lone surrogate|finite|nested too deeply/
    check(
      fc.property(jsonish, (text) => {
        let expected: { value: unknown } | undefined
        try {
          expected = { value: JSON.parse(text) }
        } catch {}
        let actual: { value: unknown } | undefined
        try {
          actual = { value: parseStrictJson(text) }
        } catch (error) {
          expect(error).toBeInstanceOf(JsonSyntaxError)
          if (expected) expect((error as Error).message).toMatch(ownRules)
        }
        if (actual) expect(actual).toEqual(expected)
      }),
      3_000,
    )
  })
})

// --- Idempotency-Key -----------------------------------------------------------------------------------------------

const KEY_CHARS = Array.from({ length: 0x7f - 0x20 }, (_, i) => String.fromCharCode(0x20 + i)).filter(
  (c) => c !== ',',
)
const validKey = fc.string({ unit: fc.constantFrom(...KEY_CHARS), minLength: 1, maxLength: MAX_KEY_LENGTH })
const CODES: readonly KeyErrorCode[] = [
  'idempotency_key_missing',
  'idempotency_key_malformed',
  'idempotency_key_too_long',
  'idempotency_key_repeated',
]

/** The RFC 8941 string form of a key. */
const quote = (key: string) => `"${key.replace(/[\\"]/g, (c) => `\\${c}`)}"`

/**
 * What the grammar accepts, written independently of the parser: optional whitespace (SP, HTAB) around either a
 * bare key or an RFC 8941 string holding one; a key is 1 to 255 of printable ASCII without the comma.
 */
function expectedKey(header: string): string | undefined {
  const value = header.replace(/^[ \t]+|[ \t]+$/g, '')
  let key = value
  if (value.startsWith('"')) {
    const quoted = /^"((?:[\x20\x21\x23-\x5b\x5d-\x7e]|\\["\\])*)"$/.exec(value)
    if (!quoted) return undefined
    key = quoted[1]!.replace(/\\(.)/g, '$1')
  }
  return /^[\x20-\x2b\x2d-\x7e]{1,255}$/.test(key) ? key : undefined
}

/** A header value with every byte outside printable ASCII escaped, so U+00A0 is not shown as a space. */
const visible = (text: string) =>
  text.replace(/[^\x20-\x7e]/g, (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, '0')}`)

describe('Idempotency-Key parsing', () => {
  it('round-trips every valid key in its RFC 8941 string form, and in bare form when it can be written bare', () => {
    check(
      fc.property(validKey, fc.constantFrom('', ' ', '\t'), (key, ows) => {
        expect(isValidKey(key)).toBe(true)
        expect(parseIdempotencyKey(`${ows}${quote(key)}${ows}`)).toEqual({ ok: true, key })
        expect(parseIdempotencyKey([quote(key)])).toEqual({ ok: true, key })
        // Bare, a key cannot start with a quote (it would read as the string form), nor keep spaces at its ends.
        if (!key.startsWith('"') && key.trim() === key) {
          expect(parseIdempotencyKey(`${ows}${key}${ows}`)).toEqual({ ok: true, key })
        }
      }),
      2_000,
    )
  })

  it('accepts exactly what the grammar accepts, and refuses everything else with a typed code, never a throw', () => {
    const near = fc.oneof(
      validKey,
      validKey.map(quote),
      fc.string({ unit: fc.constantFrom(...KEY_CHARS, '"', '\\', ',', ' ', '\t'), maxLength: 12 }),
      fc.string({ unit: 'binary', maxLength: 12 }),
      fc
        .tuple(
          fc.constantFrom(
            '\u00a0',
            '\ufeff',
            '\u2028',
            '\u3000',
            '\u000b',
            '\u000c',
            '\r',
            '\n',
            'é',
            '\u0000',
          ),
          validKey,
          fc.boolean(),
        )
        .map(([odd, key, before]) => (before ? `${odd}${key}` : `${key}${odd}`)),
      fc.string({
        unit: fc.constantFrom(...KEY_CHARS),
        minLength: MAX_KEY_LENGTH - 1,
        maxLength: MAX_KEY_LENGTH + 3,
      }),
    )
    check(
      fc.property(near, (header) => {
        const parsed = parseIdempotencyKey(header)
        const expected = expectedKey(header)
        if (expected === undefined) {
          expect(parsed.ok, visible(header)).toBe(false)
          if (!parsed.ok) {
            expect(CODES).toContain(parsed.code)
            expect(parsed.detail.length).toBeGreaterThan(0)
          }
        } else {
          expect(parsed, visible(header)).toEqual({ ok: true, key: expected })
        }
      }),
      5_000,
    )
  })

  it('refuses a repeated header, whatever its values', () => {
    check(
      fc.property(fc.array(fc.string(), { minLength: 2, maxLength: 4 }), (values) => {
        expect(parseIdempotencyKey(values)).toMatchObject({ ok: false, code: 'idempotency_key_repeated' })
      }),
      500,
    )
  })
})

// --- Retry-After ---------------------------------------------------------------------------------------------------

describe('Retry-After', () => {
  it('formats any wait as delta-seconds that parse back to the wait rounded up to a whole second (at least 1)', () => {
    check(
      fc.property(fc.oneof(fc.double({ min: 0, max: 1e7, noNaN: true }), fc.nat()), (ms) => {
        const text = formatRetryAfter(ms)
        expect(text).toMatch(/^[1-9]\d*$/)
        const parsed = parseRetryAfter(text)!
        expect(parsed).toBe(Math.max(1, Math.ceil(ms / 1000)) * 1000)
        expect(parsed).toBeGreaterThanOrEqual(ms)
        expect(parsed).toBeLessThanOrEqual(ms + 1000)
      }),
      2_000,
    )
  })

  it('formats every number, however large, negative or not a number, as delta-seconds the parser accepts', () => {
    check(
      fc.property(
        fc.oneof(fc.double(), fc.constantFrom(Number.MAX_VALUE, 1e21, 1e24, 2 ** 53 * 1000)),
        (ms) => {
          const text = formatRetryAfter(ms)
          expect(text).toMatch(/^[1-9]\d*$/)
          expect(parseRetryAfter(text)).toBeGreaterThanOrEqual(1000)
        },
      ),
      2_000,
    )
  })

  it('reads an HTTP-date as the time from the response Date (or now) to it, never negative', () => {
    const instant = fc
      .integer({ min: Date.UTC(1995, 0, 1), max: Date.UTC(2099, 0, 1) })
      .map((t) => t - (t % 1000))
    check(
      fc.property(instant, instant, fc.boolean(), (at, reference, asDate) => {
        const value = new Date(at).toUTCString()
        const options = asDate ? { date: new Date(reference).toUTCString() } : { now: reference }
        expect(parseRetryAfter(value, options)).toBe(Math.max(0, at - reference))
      }),
      1_000,
    )
  })

  it('answers undefined for garbage and never throws', () => {
    const garbage = fc.oneof(
      fc.string({ unit: 'binary', maxLength: 30 }),
      fc.integer({ max: -1 }).map(String),
      fc
        .double()
        .map(String)
        .filter((s) => !/^\d+$/.test(s)),
      fc.constantFrom(
        '',
        '   ',
        '1.5',
        '+3',
        '0x10',
        '3 s',
        'Infinity',
        'NaN',
        '1e3',
        'Mon, 99 Foo 2015 99:99:99 GMT',
      ),
    )
    check(
      fc.property(garbage, fc.option(fc.string(), { nil: undefined }), (value, date) => {
        const parsed = parseRetryAfter(value, { date, now: 0 })
        const seconds = /^\s*(\d+)\s*$/.exec(value)?.[1]
        if (seconds !== undefined)
          expect(parsed).toBe(Number.isSafeInteger(Number(seconds)) ? Number(seconds) * 1000 : undefined)
        else if (!/^\s*(Mon|Tue|Wed|Thu|Fri|Sat|Sun)/.test(value)) expect(parsed).toBeUndefined()
        else if (parsed !== undefined) expect(parsed).toBeGreaterThanOrEqual(0)
      }),
      3_000,
    )
  })

  it('answers undefined for delta-seconds too large to hold exactly, instead of a wrong wait', () => {
    check(
      fc.property(fc.bigInt({ min: BigInt(Number.MAX_SAFE_INTEGER) + 1n, max: 10n ** 40n }), (seconds) => {
        expect(parseRetryAfter(String(seconds))).toBeUndefined()
      }),
      500,
    )
  })
})
