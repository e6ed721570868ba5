import { createHash } from 'node:crypto'
import { describe, expect, it } from 'vitest'
import {
  canonicalJson,
  fingerprintMaterial,
  formatRetryAfter,
  isProblemDetails,
  JsonSyntaxError,
  parseIdempotencyKey,
  parseRetryAfter,
  parseStrictJson,
  problem,
  requestFingerprint,
} from '../src/index.js'
import { sha256Hex } from '../src/sha256.js'

describe('parseIdempotencyKey', () => {
  it('accepts bare and RFC 8941 quoted keys', () => {
    expect(parseIdempotencyKey('abc-123')).toEqual({ ok: true, key: 'abc-123' })
    expect(parseIdempotencyKey('"abc-123"')).toEqual({ ok: true, key: 'abc-123' })
    expect(parseIdempotencyKey('"a\\"b\\\\c"')).toEqual({ ok: true, key: 'a"b\\c' })
    expect(parseIdempotencyKey(['only-one'])).toEqual({ ok: true, key: 'only-one' })
  })

  it('has distinct codes for missing, malformed, too long and repeated keys', () => {
    expect(parseIdempotencyKey(undefined)).toMatchObject({ ok: false, code: 'idempotency_key_missing' })
    expect(parseIdempotencyKey('')).toMatchObject({ ok: false, code: 'idempotency_key_malformed' })
    expect(parseIdempotencyKey('"unterminated')).toMatchObject({
      ok: false,
      code: 'idempotency_key_malformed',
    })
    expect(parseIdempotencyKey('"bad\\x"')).toMatchObject({ ok: false, code: 'idempotency_key_malformed' })
    expect(parseIdempotencyKey('ключ')).toMatchObject({ ok: false, code: 'idempotency_key_malformed' })
    expect(parseIdempotencyKey('a'.repeat(255))).toMatchObject({ ok: true })
    expect(parseIdempotencyKey('a'.repeat(256))).toMatchObject({
      ok: false,
      code: 'idempotency_key_too_long',
    })
    expect(parseIdempotencyKey('k1, k2')).toMatchObject({ ok: false, code: 'idempotency_key_repeated' })
    expect(parseIdempotencyKey(['k1', 'k2'])).toMatchObject({ ok: false, code: 'idempotency_key_repeated' })
    expect(parseIdempotencyKey('"k1", "k2"')).toMatchObject({ ok: false, code: 'idempotency_key_repeated' })
  })

  it('strips only the whitespace HTTP allows around a value (SP, HTAB), so another byte is never dropped', () => {
    expect(parseIdempotencyKey(' \tabc\t ')).toEqual({ ok: true, key: 'abc' })
    expect(parseIdempotencyKey(' " abc "\t')).toEqual({ ok: true, key: ' abc ' })
    // Node reads the obs-text byte 0xA0 as U+00A0: "\xa0abc" is another header value than "abc", not the same key.
    for (const odd of ['\u00a0', '\ufeff', '\u2028', '\u3000', '\u000b', '\u000c', '\r', '\n']) {
      expect(parseIdempotencyKey(`${odd}abc`), JSON.stringify(odd)).toMatchObject({
        ok: false,
        code: 'idempotency_key_malformed',
      })
      expect(parseIdempotencyKey(`"abc"${odd}`), JSON.stringify(odd)).toMatchObject({ ok: false })
    }
  })
})

describe('strict JSON and canonical JSON', () => {
  it('sorts keys and drops whitespace (RFC 8785)', () => {
    const a = parseStrictJson('{ "b": 1, "a": { "d": [1, 2.5, "x"], "c": null } }')
    const b = parseStrictJson('{"a":{"c":null,"d":[1,2.5,"x"]},"b":1}')
    expect(canonicalJson(a)).toBe('{"a":{"c":null,"d":[1,2.5,"x"]},"b":1}')
    expect(canonicalJson(a)).toBe(canonicalJson(b))
  })

  it('matches the RFC 8785 number and string serialisation', () => {
    expect(canonicalJson([123.456, 1e-7, -0, 0.1, 'é\u2028', '\u0001'])).toBe(
      '[123.456,1e-7,0,0.1,"é\u2028","\\u0001"]',
    )
    expect(canonicalJson({ '\u20ac': 1, '\r': 2, '1': 3, '\ud83d\ude00': 4 })).toBe(
      '{"\\r":2,"1":3,"€":1,"😀":4}',
    )
  })

  it('rejects duplicate member names and unsafe integers', () => {
    expect(() => parseStrictJson('{"a":1,"a":2}')).toThrow(/Duplicate member name "a"/)
    expect(() => parseStrictJson('{"x":{"a":1,"b":{"a":1},"a":3}}')).toThrow(JsonSyntaxError)
    expect(() => parseStrictJson('{"amount":9007199254740993}')).toThrow(/2\^53/)
    expect(() => parseStrictJson('1e300')).toThrow(/2\^53/)
    expect(parseStrictJson('9007199254740991')).toBe(9007199254740991)
    expect(() => canonicalJson({ n: 2 ** 60 })).toThrow(JsonSyntaxError)
    expect(() => canonicalJson({ n: Number.NaN })).toThrow(JsonSyntaxError)
  })

  it('refuses a lone surrogate, escaped or raw, in a string or a member name (I-JSON)', () => {
    const lone = [
      String.raw`"\ud800"`,
      String.raw`"x\udc00y"`,
      String.raw`"\ud800\u0041"`,
      String.raw`"\udc00\ud800"`,
      String.raw`{"\udfff":1}`,
      '"\ud800"',
      '"a\udc00"',
      '"\ud800\\n"',
      '{"\ud800":1}',
      // A raw high half, then an escaped low half: the text itself is not well-formed Unicode.
      '"\ud83d\\ude00"',
    ]
    for (const text of lone) {
      expect(() => parseStrictJson(text), text).toThrow(JsonSyntaxError)
      expect(() => parseStrictJson(text), text).toThrow(/Lone surrogate/)
    }
    expect(parseStrictJson(String.raw`"\ud83d\ude00"`)).toBe('\u{1F600}')
    expect(parseStrictJson('"\u{1F600}\\n"')).toBe('\u{1F600}\n')
    expect(parseStrictJson('{"\u{1F600}":1}')).toEqual({ '\u{1F600}': 1 })
  })

  it('refuses to serialise a lone surrogate instead of escaping it as is', () => {
    for (const value of ['\ud800', 'a\udc00', ['\udbff'], { k: '\ud800x' }, { '\udc00': 1 }]) {
      expect(() => canonicalJson(value)).toThrow(JsonSyntaxError)
      expect(() => canonicalJson(value)).toThrow(/Lone surrogate/)
    }
    expect(canonicalJson('\ud83d\ude00')).toBe('"\u{1F600}"')
  })

  it('parses what JSON.parse parses, including escapes and __proto__ as data', () => {
    const samples = ['"a\\nb\\u00e9\\""', '[]', '{}', '[true,false,null]', '-0.5e-3', '{"__proto__":{"x":1}}']
    for (const text of samples) expect(parseStrictJson(text)).toEqual(JSON.parse(text))
    const parsed = parseStrictJson('{"__proto__":{"polluted":true}}') as Record<string, unknown>
    expect(Object.getPrototypeOf(parsed)).toBe(Object.prototype)
    expect(({} as Record<string, unknown>).polluted).toBeUndefined()
  })

  it("reads names Object.prototype also has as the object's own members, and refuses them twice", () => {
    const text = '{"constructor":1,"toString":"x","hasOwnProperty":null,"__proto__":2}'
    expect(parseStrictJson(text)).toEqual(JSON.parse(text))
    expect(Object.keys(parseStrictJson(text) as object)).toEqual([
      'constructor',
      'toString',
      'hasOwnProperty',
      '__proto__',
    ])
    for (const name of ['constructor', '__proto__'])
      expect(() => parseStrictJson(`{"${name}":1,"${name}":2}`)).toThrow(/Duplicate member name/)
  })

  it('rejects malformed JSON with a position', () => {
    for (const text of ['', '{', '[1,]', '{"a" 1}', '01', '1.', 'tru', '"\u0001"', '{} x', '"\\q"']) {
      expect(() => parseStrictJson(text), text).toThrow(JsonSyntaxError)
    }
  })
})

describe('fingerprint', () => {
  it('is the same for canonically equal bodies and differs otherwise', () => {
    const base = { method: 'post', route: '/v1/payments' }
    const a = requestFingerprint({ ...base, body: { amount: 100, currency: 'eur' } })
    expect(requestFingerprint({ ...base, body: { currency: 'eur', amount: 100 } })).toBe(a)
    expect(requestFingerprint({ ...base, body: { currency: 'eur', amount: 101 } })).not.toBe(a)
    expect(
      requestFingerprint({ ...base, route: '/v1/refunds', body: { amount: 100, currency: 'eur' } }),
    ).not.toBe(a)
    expect(requestFingerprint({ ...base, body: { amount: 100, currency: 'eur' }, query: {} })).not.toBe(a)
  })

  it('covers the path with its parameter values; a path equal to the route adds nothing', () => {
    const base = { method: 'POST', route: '/v1/accounts/:id/transfers', body: { amount: 1 } }
    const a = requestFingerprint({ ...base, path: '/v1/accounts/A/transfers' })
    expect(requestFingerprint({ ...base, path: '/v1/accounts/B/transfers' })).not.toBe(a)
    expect(requestFingerprint({ ...base, path: '/v1/accounts/A/transfers' })).toBe(a)
    expect(requestFingerprint(base)).not.toBe(a)
    const plain = { method: 'POST', route: '/v1/payments', body: { amount: 1 } }
    expect(fingerprintMaterial({ ...plain, path: '/v1/payments' })).toBe(fingerprintMaterial(plain))
    // The material as it is hashed: the query's canonical JSON, then the path as a JSON string.
    expect(fingerprintMaterial({ ...base, path: '/v1/accounts/A\n/transfers', query: { q: 'x' } })).toBe(
      'POST\n/v1/accounts/:id/transfers\n{"amount":1}\n{"q":"x"}\n"/v1/accounts/A\\n/transfers"',
    )
    // A path never reads as a query, nor a query as a path.
    expect(fingerprintMaterial({ ...plain, path: '{}' })).not.toBe(
      fingerprintMaterial({ ...plain, query: {} }),
    )
  })

  it('uses a SHA-256 that agrees with node:crypto', () => {
    for (const text of ['', 'abc', 'é'.repeat(1000), 'x'.repeat(55), 'x'.repeat(56), 'x'.repeat(64)]) {
      expect(sha256Hex(text)).toBe(createHash('sha256').update(text).digest('hex'))
    }
    const material = fingerprintMaterial({ method: 'POST', route: '/r', body: { a: 1 } })
    expect(requestFingerprint({ method: 'POST', route: '/r', body: { a: 1 } })).toBe(
      createHash('sha256').update(material).digest('hex'),
    )
  })
})

describe('Retry-After', () => {
  it('parses delta-seconds and HTTP-dates against the response Date', () => {
    expect(parseRetryAfter('3')).toBe(3000)
    expect(parseRetryAfter(' 0 ')).toBe(0)
    expect(parseRetryAfter('Wed, 21 Oct 2015 07:28:00 GMT', { date: 'Wed, 21 Oct 2015 07:27:58 GMT' })).toBe(
      2000,
    )
    // A client clock 1 hour off does not matter when the response has a Date header.
    const now = Date.parse('Wed, 21 Oct 2015 08:27:58 GMT')
    expect(
      parseRetryAfter('Wed, 21 Oct 2015 07:28:00 GMT', { date: 'Wed, 21 Oct 2015 07:27:58 GMT', now }),
    ).toBe(2000)
    expect(
      parseRetryAfter('Wed, 21 Oct 2015 07:28:00 GMT', { now: Date.parse('Wed, 21 Oct 2015 07:27:59 GMT') }),
    ).toBe(1000)
    expect(parseRetryAfter('Wed, 21 Oct 2015 07:28:00 GMT', { now })).toBe(0)
    expect(parseRetryAfter('soon')).toBeUndefined()
    expect(parseRetryAfter('-1')).toBeUndefined()
    expect(parseRetryAfter(undefined)).toBeUndefined()
  })

  it('formats at least one whole second, rounded up', () => {
    expect(formatRetryAfter(0)).toBe('1')
    expect(formatRetryAfter(1)).toBe('1')
    expect(formatRetryAfter(1001)).toBe('2')
    expect(formatRetryAfter(Number.NaN)).toBe('1')
    expect(formatRetryAfter(-5)).toBe('1')
  })

  it('formats a huge wait as delta-seconds a parser accepts, capped at 2^31 seconds', () => {
    // String(n) writes 1e21 and above in exponent form, which is not delta-seconds.
    for (const ms of [1e24, Number.MAX_VALUE, Number.POSITIVE_INFINITY, 2 ** 53 * 1000]) {
      expect(formatRetryAfter(ms), String(ms)).toBe('2147483648')
      expect(parseRetryAfter(formatRetryAfter(ms))).toBe(2_147_483_648_000)
    }
    expect(formatRetryAfter(2_147_483_647_001)).toBe('2147483648')
  })
})

describe('problem', () => {
  it('builds RFC 9457 problem details with a stable type and code', () => {
    const details = problem('idempotency_key_reused', 'Use a new key for a new request.')
    expect(details).toEqual({
      type: 'urn:oncely:problem:idempotency_key_reused',
      title: 'Idempotency-Key was already used with a different request',
      status: 422,
      detail: 'Use a new key for a new request.',
      code: 'idempotency_key_reused',
    })
    expect(isProblemDetails(details)).toBe(true)
    expect(isProblemDetails({ message: 'x' })).toBe(false)
  })
})
