// The path that counts toward a request's fingerprint: decoded as the routers match it, so every spelling the router
// takes for one path is one path, and no two paths it tells apart become one.
import fc from 'fast-check'
import { getPath } from 'hono/utils/url'
import { describe, expect, it } from 'vitest'
import { decodePath, targetPath } from '../../src/http/request.js'

/** Hono's own decoding of a request's path, with the hex digits of the escapes it left upper-cased. */
const honoPath = (path: string) =>
  getPath(new Request(`http://test${path}`)).replace(/%[0-9a-f]{2}/gi, (hex) => hex.toUpperCase())

describe('decodePath', () => {
  it.each([
    ['/v1/orders', '/v1/orders'],
    ['/v1/%6Frders', '/v1/orders'],
    ['/v1/accounts/%41/transfers', '/v1/accounts/A/transfers'],
    ['/v1/a%20b', '/v1/a b'],
    ['/v1/%E2%82%AC', '/v1/\u20ac'],
    // Reserved characters stay encoded, so a decoded slash never reads as a segment boundary.
    ['/v1/a%2Fb', '/v1/a%2Fb'],
    ['/v1/a%2fb', '/v1/a%2Fb'],
    ['/v1/%3a%40%3F%23', '/v1/%3A%40%3F%23'],
    // An encoded percent stays encoded: decoding it would make %2541 read as %41, then A.
    ['/v1/%25', '/v1/%25'],
    ['/v1/%2541', '/v1/%2541'],
    // Escapes that are not UTF-8, and a percent sign that is no escape, are left as they are.
    ['/v1/%E2%82', '/v1/%E2%82'],
    ['/v1/%FF%41', '/v1/%FF%41'],
    ['/v1/%zz', '/v1/%zz'],
  ])('%s is %s', (path, decoded) => {
    expect(decodePath(path)).toBe(decoded)
  })

  it.each([
    '/v1/orders',
    '/v1/%6Frders',
    '/v1/a%2fb',
    '/v1/%2541%41',
    '/v1/%E2%82%AC%E2%82',
    '/v1/%C3%A9t%C3%A9',
  ])('decodes %s as Hono routes it', (path) => {
    expect(decodePath(path)).toBe(honoPath(path))
  })

  it('agrees with Hono on paths made of escapes and characters, in a large sample', () => {
    const piece = fc.oneof(
      fc.constantFrom('/', 'a', 'A', '%', '-', '.'),
      fc.integer({ min: 0, max: 255 }).map((byte) => `%${byte.toString(16).padStart(2, '0')}`),
      fc.integer({ min: 0, max: 255 }).map((byte) => `%${byte.toString(16).padStart(2, '0').toUpperCase()}`),
    )
    const path = fc.array(piece, { maxLength: 12 }).map((pieces) => `/${pieces.join('')}`)
    fc.assert(
      fc.property(path, (raw) => {
        // What a server is handed: the URL parser's serialisation (dot segments resolved, `%` kept).
        const served = new URL(`http://test${raw}`).pathname
        expect(decodePath(served)).toBe(honoPath(served))
      }),
      { seed: 22, numRuns: 2_000 },
    )
  })
})

describe('targetPath', () => {
  it.each([
    ['/v1/orders', '/v1/orders'],
    ['/v1/orders?x=1#top', '/v1/orders'],
    ['/v1/orders#top', '/v1/orders'],
    ['http://api.test/v1/orders?x=1', '/v1/orders'],
    ['https://api.test:8443/v1/%6Frders', '/v1/%6Frders'],
    ['http://api.test', '/'],
    ['http://api.test?x=/y', '/'],
  ])('%s is %s', (target, path) => {
    expect(targetPath(target)).toBe(path)
  })
})
