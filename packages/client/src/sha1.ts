// SHA-1 in plain JS for name-based (version 5) UUIDs: the key of a named intent must be derived the same way in
// every runtime, insecure origins and Hermes included, where WebCrypto is missing, and synchronously.

const ROTL = (x: number, n: number) => (x << n) | (x >>> (32 - n))
const K = [0x5a827999, 0x6ed9eba1, 0x8f1bbcdc, 0xca62c1d6]

/** The SHA-1 digest (20 bytes) of `bytes`. */
export function sha1(bytes: ArrayLike<number>): number[] {
  const length = bytes.length
  // Message, 0x80, zero padding to 56 mod 64, then the bit length (below 2^32 here: names are short).
  const words = new Array<number>((((length + 8) >> 6) + 1) * 16).fill(0)
  for (let i = 0; i < length; i++) words[i >> 2]! |= bytes[i]! << (24 - (i % 4) * 8)
  words[length >> 2]! |= 0x80 << (24 - (length % 4) * 8)
  words[words.length - 1] = length * 8
  const h = [0x67452301, 0xefcdab89, 0x98badcfe, 0x10325476, 0xc3d2e1f0]
  const w = new Array<number>(80)
  for (let block = 0; block < words.length; block += 16) {
    let [a, b, c, d, e] = h as [number, number, number, number, number]
    for (let t = 0; t < 80; t++) {
      const round = (t / 20) | 0
      w[t] = t < 16 ? words[block + t]! : ROTL(w[t - 3]! ^ w[t - 8]! ^ w[t - 14]! ^ w[t - 16]!, 1)
      const f = round === 0 ? (b & c) | (~b & d) : round === 2 ? (b & c) | (b & d) | (c & d) : b ^ c ^ d
      const next = (ROTL(a, 5) + f + e + K[round]! + w[t]!) | 0
      e = d
      d = c
      c = ROTL(b, 30)
      b = a
      a = next
    }
    h[0] = (h[0]! + a) | 0
    h[1] = (h[1]! + b) | 0
    h[2] = (h[2]! + c) | 0
    h[3] = (h[3]! + d) | 0
    h[4] = (h[4]! + e) | 0
  }
  return h.flatMap((word) => [word >>> 24, (word >>> 16) & 255, (word >>> 8) & 255, word & 255])
}

/** A version 5 UUID (RFC 9562) of `name` (as UTF-8) in the namespace `namespace` (a UUID string). */
export function uuidV5(name: string, namespace: string): string {
  const ns = namespace
    .replace(/-/g, '')
    .match(/../g)!
    .map((byte) => Number.parseInt(byte, 16))
  // UTF-8 without TextEncoder (missing on older Hermes); a lone surrogate throws URIError, as it did with uuid.
  const utf8 = unescape(encodeURIComponent(name))
  const digest = sha1([...ns, ...Array.from(utf8, (char) => char.charCodeAt(0))])
  digest[6] = (digest[6]! & 0x0f) | 0x50
  digest[8] = (digest[8]! & 0x3f) | 0x80
  let hex = ''
  for (let i = 0; i < 16; i++) hex += (digest[i]! | 256).toString(16).slice(1)
  return `${hex.slice(0, 8)}-${hex.slice(8, 12)}-${hex.slice(12, 16)}-${hex.slice(16, 20)}-${hex.slice(20)}`
}
