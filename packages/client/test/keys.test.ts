// The client's own SHA-1 and version 5 UUIDs: a named intent's key must stay exactly what the uuid package derived
// before, in every runtime, or intents written by an earlier release would be resent under another key.
import { v5 } from 'uuid'
import { expect, it } from 'vitest'
import { deriveKey } from '../src/keys.js'
import { sha1, uuidV5 } from '../src/sha1.js'

const hex = (bytes: number[]) => bytes.map((b) => b.toString(16).padStart(2, '0')).join('')
const ascii = (text: string) => Array.from(text, (c) => c.charCodeAt(0))

it('computes SHA-1 test vectors (FIPS 180-2), across block boundaries', () => {
  expect(hex(sha1([]))).toBe('da39a3ee5e6b4b0d3255bfef95601890afd80709')
  expect(hex(sha1(ascii('abc')))).toBe('a9993e364706816aba3e25717850c26c9cd0d89d')
  expect(hex(sha1(ascii('abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq')))).toBe(
    '84983e441c3bd26ebaae4aa1f95129e5e54670f1',
  )
  expect(hex(sha1(ascii('a'.repeat(1000))))).toBe('291e9a6c66994949b57ba5e650361e98fc36b1ba')
})

it('derives the same version 5 UUIDs as the uuid package, for every length and any Unicode', () => {
  expect(uuidV5('www.example.com', '6ba7b810-9dad-11d1-80b4-00c04fd430c8')).toBe(
    '2ed6657d-e927-568b-95e1-2665a8aea6a2',
  )
  const namespace = '0b3c8f2e-5a1d-4e6b-9c7f-2d4a6e8b1c3f'
  const chars = [0x61, 0xe9, 0x4e2d, 0x1f600]
  for (let n = 0; n < 200; n++) {
    const name = Array.from({ length: n }, (_, i) => String.fromCodePoint(chars[(i * 7 + n) % 4]!)).join('')
    expect(uuidV5(name, namespace)).toBe(v5(name, namespace))
  }
  expect(deriveKey('checkout:cart_42', 'POST', 'https://api.example.com/v1/payments')).toBe(
    v5('checkout:cart_42\nPOST\nhttps://api.example.com/v1/payments', namespace),
  )
})
