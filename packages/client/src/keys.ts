import { uuidV5 } from './sha1.js'

// Fixed namespace for derived keys, so the same intent gives the same key in every runtime and release.
const NAMESPACE = '0b3c8f2e-5a1d-4e6b-9c7f-2d4a6e8b1c3f'

/**
 * A time-ordered RFC 9562 version 7 UUID: 48 bits of Unix milliseconds, then 74 random bits. Keys minted one after
 * another sort together, so the server's key index takes them near its right edge instead of on a random page each
 * (after a checkpoint, a random page costs a full-page image in the WAL). Drawn with `crypto.getRandomValues`, present
 * on insecure origins (plain http) and Hermes too.
 */
export function randomKey(now: number = Date.now()): string {
  const c = globalThis.crypto
  if (typeof c?.getRandomValues !== 'function') {
    throw new TypeError('No secure random source: crypto.getRandomValues is missing in this runtime')
  }
  const b = c.getRandomValues(new Uint8Array(16))
  // 48-bit big-endian milliseconds: the high 16 bits, then the low 32 (bitwise operators work on 32 bits only).
  const high = Math.floor(now / 2 ** 32)
  b[0] = (high >>> 8) & 0xff
  b[1] = high & 0xff
  b[2] = (now >>> 24) & 0xff
  b[3] = (now >>> 16) & 0xff
  b[4] = (now >>> 8) & 0xff
  b[5] = now & 0xff
  b[6] = (b[6]! & 0x0f) | 0x70 // version 7
  b[8] = (b[8]! & 0x3f) | 0x80 // RFC 9562 variant
  let hex = ''
  for (const byte of b) hex += byte.toString(16).padStart(2, '0')
  return `${hex.slice(0, 8)}-${hex.slice(8, 12)}-${hex.slice(12, 16)}-${hex.slice(16, 20)}-${hex.slice(20)}`
}

/**
 * A UUID version 5 derived from the intent id and its target, so the same business fact always gives the same key
 * (across reloads, devices and processes). Pure JS SHA-1: works on insecure origins and Hermes. Try `n` of the
 * intent (after `n` tries that ended in a final error, see `retryFailed`) has a key of its own, derived the same
 * way, so every device walks the same sequence of keys; try 0 is the intent's first key.
 */
export function deriveKey(intentId: string, method: string, url: string, tryNumber = 0): string {
  const name = `${intentId}\n${method}\n${url}`
  return uuidV5(tryNumber === 0 ? name : `${name}\n${tryNumber}`, NAMESPACE)
}
