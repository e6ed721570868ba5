/**
 * Random and hostile HTTP requests for the fuzzer (`test/fuzz.test.ts`), as plain data so fast-check can shrink a
 * failing one and print it; `sendRaw` writes one byte for byte on its own socket, so repeated headers, non-ASCII
 * header bytes and invalid UTF-8 in a body arrive exactly as generated.
 */
import { connect } from 'node:net'
import fc from 'fast-check'

/** Stands for a fresh key id in a generated Idempotency-Key; `render` replaces it, so runs never share a key. */
export const NONCE = '@@'

/** One generated request. */
export interface FuzzRequest {
  method: string
  path: string
  /** Header lines in order (a name may repeat); values are written as latin1, one byte per character. */
  headers: [name: string, value: string][]
  /** Text is sent as UTF-8, a byte array as is; `undefined` sends no body. */
  body: string | number[] | undefined
  /** Sends the body chunked instead of with a Content-Length. */
  chunked: boolean
  /** Uses the key id of the request before (a retry, or a key reused with another body) instead of a fresh one. */
  reuseKey: boolean
}

/** A response as read off the socket. */
export interface RawResponse {
  status: number
  headers: Record<string, string>
  body: Buffer
}

const latin1 = (text: string) => Buffer.from(text, 'utf8').toString('latin1')

// What HTTP/1.1 lets a field value carry: VCHAR, SP, HTAB and obs-text (read by Node as latin1).
const printable = fc.integer({ min: 0x20, max: 0x7e }).map((c) => String.fromCharCode(c))
const obsText = fc.integer({ min: 0x80, max: 0xff }).map((c) => String.fromCharCode(c))
const fieldText = (maxLength: number) =>
  fc.string({ unit: fc.oneof({ weight: 4, arbitrary: printable }, obsText, fc.constant('\t')), maxLength })
// A control character, which Node's HTTP parser refuses before any route sees the request.
const withControl = fc
  .tuple(fieldText(10), fc.constantFrom('\u0000', '\u0001', '\u001f', '\u007f', '\r', '\n'), fieldText(10))
  .map(([before, control, after]) => `${before}${control}${after}`)

/** One Idempotency-Key header value, in the many forms clients (and attackers) send. */
const keyValue: fc.Arbitrary<string> = fc.oneof(
  { weight: 6, arbitrary: fc.constant(NONCE) },
  fc.constant(`"${NONCE}"`),
  fc.constant(`"${NONCE}\\"q\\\\"`),
  fc.constant(` \t${NONCE}\t `),
  fc.constant(`${NONCE};q=1`),
  fc.constant(`:${NONCE}:`),
  fc.constant(`"${NONCE}";ttl=10`),
  fc.constant(`"${NONCE}", "${NONCE}b"`),
  fc.constant(`${NONCE}, ${NONCE}b`),
  fc.constant(`("${NONCE}")`),
  fc.constant(`"${NONCE}`),
  fc.constant(`"${NONCE}\\x"`),
  fc.constant(''),
  fc.constant('   '),
  fc.constant('""'),
  fc.constant(`\u00a0${NONCE}`),
  fc.constant(`${NONCE}\u00e9`),
  fc.constant(latin1(`ключ-${NONCE}`)),
  fc.constant(latin1(`${NONCE}-😀`)),
  fc.nat({ max: 400 }).map((n) => `${NONCE}${'k'.repeat(n)}`),
  fc.integer({ min: 250, max: 260 }).map((n) => 'k'.repeat(n)),
  withControl,
  fieldText(40),
  fieldText(300),
)

const authorization = fc.oneof(
  { weight: 40, arbitrary: fc.constant('Bearer fuzz') },
  fc.constant('Bearer fuzz_other'),
  fc.constant('Bearer FUZZ'),
  fc.constant('Bearer '),
  fc.constant('Basic ZnV6ejo='),
  fc.constant(`Bearer ${'a'.repeat(65)}`),
  fieldText(30),
)

const contentType = fc.oneof(
  { weight: 10, arbitrary: fc.constant('application/json') },
  fc.constantFrom(
    'application/json; charset=utf-8',
    'APPLICATION/JSON',
    'application/json;charset=latin1',
    ' application/json ',
    'application/json, text/plain',
    'application/problem+json',
    'application/merge-patch+json',
    'text/plain',
    'text/json',
    'application/x-www-form-urlencoded',
    'multipart/form-data; boundary=x',
    'application/octet-stream',
    '',
    '*/*',
  ),
  fieldText(30),
)

const ordinaryHeader = fc.oneof(
  fc.tuple(
    fc.constant('accept'),
    fc.constantFrom('text/html', 'application/json', '*/*', 'application/problem+json'),
  ),
  fc.tuple(fc.constant('oncely-attempt'), fc.oneof(fc.nat().map(String), fieldText(10))),
  fc.tuple(fc.constant('content-encoding'), fc.constantFrom('gzip', 'identity', 'br', 'x-unknown')),
  fc.tuple(fc.constant('x-fuzz'), fieldText(60)),
  fc.tuple(fc.constantFrom('date', 'if-match', 'range', 'cookie'), fieldText(30)),
)
// Over Node's 16 KiB of headers: 431 from the HTTP parser. Rare, or it would hide the rest.
const oversizedHeader = fc
  .integer({ min: 16_000, max: 17_000 })
  .map((n): [string, string] => ['x-padding', 'p'.repeat(n)])
const otherHeader = fc.oneof(
  { weight: 40, arbitrary: ordinaryHeader },
  { weight: 1, arbitrary: oversizedHeader },
  { weight: 1, arbitrary: withControl.map((value): [string, string] => ['x-fuzz', value]) },
)

const currency = fc.oneof(
  { weight: 5, arbitrary: fc.constantFrom('eur', 'usd', 'gbp') },
  fc.string({ unit: fc.constantFrom('a', 'z', 'E', '1', 'é'), minLength: 0, maxLength: 4 }),
)
const payment = fc.record(
  {
    amount: fc.oneof(
      { weight: 6, arbitrary: fc.integer({ min: 1, max: 5_000 }) },
      fc.integer({ min: 1, max: 2_000_000 }),
    ),
    currency,
    reference: fc.string({ unit: 'grapheme', maxLength: 40 }),
  },
  { requiredKeys: ['amount', 'currency'] },
)
const validPayment = payment.map((p) => JSON.stringify(p))

const jsonish = fc.oneof(
  fc.constant(null),
  fc.boolean(),
  fc.double(),
  fc.string({ unit: 'binary', maxLength: 10 }),
  fc.array(fc.integer(), { maxLength: 3 }),
  fc.object({ maxDepth: 2, maxKeys: 3 }),
)
const wrongTypes = fc.oneof(
  fc.tuple(jsonish, currency).map(([amount, c]) => JSON.stringify({ amount, currency: c })),
  fc
    .tuple(fc.integer({ min: 1, max: 100 }), jsonish)
    .map(([amount, c]) => JSON.stringify({ amount, currency: c })),
  payment.map((p) => JSON.stringify({ ...p, tip: 5 })),
  payment.map((p) => JSON.stringify([p])),
  fc.constantFrom('1', '"eur"', 'null', 'true', '[]', '{}', '{"amount":null,"currency":null}'),
  jsonish.map((v) => JSON.stringify(v) ?? 'null'),
)

const deepNesting = fc
  .tuple(fc.integer({ min: 1, max: 700 }), fc.boolean())
  .map(([depth, arrays]) =>
    arrays
      ? `${'['.repeat(depth)}1${']'.repeat(depth)}`
      : `${'{"amount":'.repeat(depth)}1${'}'.repeat(depth)}`,
  )

const hugeNumbers = fc
  .constantFrom(
    '1e400',
    '-1e400',
    '9007199254740993',
    '123456789012345678901234567890',
    '1e21',
    '-0',
    '1e-400',
    '0.1e1',
    '1E2',
    '100.0',
    '-9007199254740992',
    '2e308',
  )
  .map((n) => `{"amount":${n},"currency":"eur"}`)

const loneSurrogates = fc.oneof(
  fc
    .tuple(fc.integer({ min: 0xd800, max: 0xdfff }), fc.constantFrom('reference', 'currency', 'member'))
    .map(([code, where]) => {
      const escaped = `\\u${code.toString(16)}`
      if (where === 'member') return `{"amount":700,"currency":"eur","${escaped}":1}`
      return where === 'currency'
        ? `{"amount":700,"currency":"${escaped}"}`
        : `{"amount":700,"currency":"eur","reference":"${escaped}"}`
    }),
  fc.constant('{"amount":700,"currency":"eur","reference":"\\ud83d\\ude00"}'),
  fc.constant('{"amount":700,"currency":"eur","reference":"\\udc00\\ud800"}'),
)

/** A valid payment's bytes with invalid UTF-8 (a stray continuation byte, an overlong form, a CESU surrogate). */
const invalidUtf8 = fc
  .tuple(
    validPayment,
    fc.nat(),
    fc.constantFrom([0x80], [0xff], [0xc0, 0xaf], [0xed, 0xa0, 0x80], [0xf4, 0x90, 0x80, 0x80], [0xe2, 0x82]),
  )
  .map(([text, at, bad]) => {
    const bytes = [...Buffer.from(text, 'utf8')]
    const i = at % (bytes.length + 1)
    return [...bytes.slice(0, i), ...bad, ...bytes.slice(i)]
  })

const truncated = fc
  .tuple(validPayment, fc.nat())
  .map(([text, at]) => text.slice(0, at % Math.max(1, text.length)))

const oddJson = fc.constantFrom(
  '{"amount":700,"amount":1,"currency":"eur"}',
  '{"__proto__":{"amount":1},"amount":700,"currency":"eur"}',
  '{"constructor":{"prototype":{"x":1}},"amount":700,"currency":"eur"}',
  '\ufeff{"amount":700,"currency":"eur"}',
  '{"amount":700,"currency":"eur"} {}',
  '{"amount":700,"currency":"eur",}',
  "{'amount':700}",
  '{"amount":0x10,"currency":"eur"}',
  '{"amount":700,"currency":"eur"}\u0000',
  'NaN',
  '',
  ' ',
)

const body: fc.Arbitrary<string | number[] | undefined> = fc.oneof(
  { weight: 8, arbitrary: validPayment },
  { weight: 1, arbitrary: fc.constant(undefined) },
  { weight: 3, arbitrary: wrongTypes },
  { weight: 1, arbitrary: deepNesting },
  { weight: 2, arbitrary: hugeNumbers },
  { weight: 2, arbitrary: loneSurrogates },
  { weight: 2, arbitrary: invalidUtf8 },
  { weight: 2, arbitrary: truncated },
  { weight: 2, arbitrary: oddJson },
  { weight: 1, arbitrary: fc.array(fc.nat({ max: 255 }), { maxLength: 64 }) },
)

const pathSegment = fc.oneof(
  fc.uuid(),
  fc.constantFrom('x', '%ZZ', '%00', '..', '%2e%2e', 'a'.repeat(300), '%F0%9F%98%80', '%C0%AF', '1;a=b', ''),
)
const path = fc.oneof(
  { weight: 12, arbitrary: fc.constant('/v1/payments') },
  pathSegment.map((s) => `/v1/payments/${s}`),
  fc.constantFrom(
    '/v1/payments/',
    '/v1/payments?x=1&x=2',
    '/v1/payments?%ZZ',
    '/v1/payments#fragment',
    '//v1/payments',
    '/V1/payments',
    '/v1/payments/../ledger',
    '/v1/payments%2F1',
    '/v1/ledger',
    '/v1/ledger?limit=-1',
    '/v1/unknown',
    '/v1',
    '/v1/',
    '/healthz',
    '/nowhere',
  ),
)

const method = fc.oneof(
  { weight: 12, arbitrary: fc.constant('POST') },
  fc.constantFrom('GET', 'PUT', 'PATCH', 'DELETE', 'HEAD', 'OPTIONS'),
  // Not CONNECT: Node closes such a connection without an answer when nothing listens for 'connect'.
  fc.constantFrom('post', 'FOO', 'TRACE'),
)

/** A random request under the demo API. */
export const fuzzRequest: fc.Arbitrary<FuzzRequest> = fc
  .record({
    method,
    path,
    authorization: fc.option(authorization, { freq: 30, nil: undefined }),
    keys: fc.oneof(
      { weight: 10, arbitrary: fc.array(keyValue, { minLength: 1, maxLength: 1 }) },
      fc.constant([]),
      fc.array(keyValue, { minLength: 2, maxLength: 3 }),
    ),
    contentType: fc.option(contentType, { freq: 10, nil: undefined }),
    others: fc.array(otherHeader, { maxLength: 2 }),
    body,
    chunked: fc.oneof({ weight: 4, arbitrary: fc.constant(false) }, fc.constant(true)),
    reuseKey: fc.oneof({ weight: 3, arbitrary: fc.constant(false) }, fc.constant(true)),
  })
  .map(({ method, path, authorization, keys, contentType, others, body, chunked, reuseKey }) => {
    const headers: [string, string][] = []
    if (authorization !== undefined) headers.push(['authorization', authorization])
    for (const key of keys) headers.push(['idempotency-key', key])
    if (contentType !== undefined) headers.push(['content-type', contentType])
    headers.push(...others)
    return { method, path, headers, body, chunked, reuseKey }
  })

/** The request with every {@link NONCE} replaced by `nonce`. */
export function render(request: FuzzRequest, nonce: string): FuzzRequest {
  return {
    ...request,
    headers: request.headers.map(([name, value]) => [name, value.split(NONCE).join(nonce)]),
  }
}

/** The values of header `name` (lower case), in order. */
export const headerValues = (request: FuzzRequest, name: string): string[] =>
  request.headers.filter(([n]) => n === name).map(([, value]) => value)

/**
 * Sends `request` to `origin` (`http://127.0.0.1:<port>`) on a connection of its own and reads the whole response.
 * Rejects when no complete response arrives within `timeoutMs` (a hang is a finding too).
 */
export function sendRaw(origin: string, request: FuzzRequest, timeoutMs = 10_000): Promise<RawResponse> {
  const { hostname, port } = new URL(origin)
  const body =
    request.body === undefined
      ? undefined
      : typeof request.body === 'string'
        ? Buffer.from(request.body, 'utf8')
        : Buffer.from(request.body)
  const lines = [
    `${request.method} ${request.path} HTTP/1.1`,
    `host: ${hostname}:${port}`,
    'connection: close',
  ]
  for (const [name, value] of request.headers) lines.push(`${name}: ${value}`)
  if (body !== undefined)
    lines.push(request.chunked ? 'transfer-encoding: chunked' : `content-length: ${body.length}`)
  const head = Buffer.from(`${lines.join('\r\n')}\r\n\r\n`, 'latin1')
  const payload =
    body === undefined
      ? Buffer.alloc(0)
      : request.chunked
        ? Buffer.concat([
            ...(body.length > 0
              ? [Buffer.from(`${body.length.toString(16)}\r\n`), body, Buffer.from('\r\n')]
              : []),
            Buffer.from('0\r\n\r\n'),
          ])
        : body

  return new Promise((resolve, reject) => {
    const socket = connect(Number(port), hostname)
    const chunks: Buffer[] = []
    const timer = setTimeout(() => {
      socket.destroy()
      reject(new Error(`no complete response within ${timeoutMs} ms`))
    }, timeoutMs)
    socket.on('data', (chunk) => chunks.push(chunk))
    socket.on('error', (error) => {
      // The server may answer and close before it read the whole body (EPIPE/ECONNRESET): the answer still counts.
      if (chunks.length === 0) {
        clearTimeout(timer)
        reject(error)
      }
    })
    socket.on('close', () => {
      clearTimeout(timer)
      try {
        resolve(parseResponse(Buffer.concat(chunks)))
      } catch (error) {
        reject(error)
      }
    })
    socket.write(Buffer.concat([head, payload]))
  })
}

function parseResponse(raw: Buffer): RawResponse {
  let rest = raw
  for (;;) {
    const end = rest.indexOf('\r\n\r\n')
    if (end === -1)
      throw new Error(`incomplete response: ${JSON.stringify(rest.toString('latin1').slice(0, 200))}`)
    const [statusLine, ...fields] = rest.subarray(0, end).toString('latin1').split('\r\n')
    const status = Number(/^HTTP\/1\.[01] (\d{3})/.exec(statusLine!)?.[1])
    if (!status) throw new Error(`not an HTTP response: ${JSON.stringify(statusLine)}`)
    rest = rest.subarray(end + 4)
    if (status >= 100 && status < 200) continue
    const headers: Record<string, string> = {}
    for (const field of fields) {
      const colon = field.indexOf(':')
      const name = field.slice(0, colon).trim().toLowerCase()
      const value = field.slice(colon + 1).trim()
      headers[name] = name in headers ? `${headers[name]}, ${value}` : value
    }
    return { status, headers, body: headers['transfer-encoding'] === 'chunked' ? dechunk(rest) : rest }
  }
}

function dechunk(raw: Buffer): Buffer {
  const parts: Buffer[] = []
  let pos = 0
  for (;;) {
    const lineEnd = raw.indexOf('\r\n', pos)
    if (lineEnd === -1) throw new Error('truncated chunked response')
    const size = Number.parseInt(raw.subarray(pos, lineEnd).toString('latin1'), 16)
    if (size === 0) return Buffer.concat(parts)
    parts.push(raw.subarray(lineEnd + 2, lineEnd + 2 + size))
    pos = lineEnd + 2 + size + 2
  }
}
