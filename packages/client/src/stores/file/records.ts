import { createHash, randomBytes } from 'node:crypto'
import { type IntentRecord, isIntentRecord } from '../../intent.js'

// An intent's file is a chain of frames. The first is the write-ahead record, written over the start of an
// allocated, zero-filled file and made durable with one fdatasync; each later version of the record (attempt
// counters, outcomes, the release of its owner) is appended after the last one without a flush. A frame is a
// fixed-size header, `oncely1 <payload bytes, 10 digits> <digest, 32 hex>\n`, then its JSON payload. Each digest
// covers the previous frame's digest and the payload, and the first payload holds a random nonce, so a frame that
// is torn, stale (left by an earlier use of the file) or from another chain never verifies: a reader takes the
// last frame of the unbroken chain from the start. A zero byte where a header should start means "no record": a
// fresh slot, or an intent its driver deleted by overwriting the first header with a zero byte and its own owner
// token (the file then waits to serve that store as a slot again).

const MAGIC = 'oncely1 '
export const HEADER_BYTES = MAGIC.length + 10 + 1 + 32 + 1

/** What a frame's payload holds: the record, and the store instance driving it without a claim, if any. */
interface Payload {
  /** The chain's nonce (first frame only). */
  n?: string
  /** The owner token: the store that created the intent and drives it until it lets go. */
  o: string | null
  r: IntentRecord
}

/** The state a file's chain ends in, which is what a writer needs to append the next frame. */
export interface Chain {
  record: IntentRecord
  owner: string | null
  /** Where the next frame goes. */
  end: number
  /** The digest the next frame chains to. */
  digest: string
}

/** What a file holds. */
export type Content =
  | { kind: 'chain'; chain: Chain }
  | { kind: 'free'; owner?: string }
  | { kind: 'corrupt'; reason: string }

const digestOf = (previous: string, payload: Buffer) =>
  createHash('sha256').update(previous).update('\n').update(payload).digest('hex').slice(0, 32)

function frame(previous: string, payload: Payload): { bytes: Buffer; digest: string } {
  const body = Buffer.from(JSON.stringify(payload))
  const digest = digestOf(previous, body)
  const header = Buffer.from(`${MAGIC}${String(body.length).padStart(10, '0')} ${digest}\n`)
  return { bytes: Buffer.concat([header, body]), digest }
}

/** The first frame of a new chain for `record`, and the chain it starts (as if written at offset 0). */
export function firstFrame(record: IntentRecord, owner: string | null): { bytes: Buffer; chain: Chain } {
  const { bytes, digest } = frame('', { n: randomBytes(8).toString('hex'), o: owner, r: record })
  return { bytes, chain: { record, owner, end: bytes.length, digest } }
}

/** The frame that appends `record` to `chain`, and the chain it leads to. */
export function nextFrame(
  chain: Chain,
  record: IntentRecord,
  owner: string | null,
): { bytes: Buffer; chain: Chain } {
  const { bytes, digest } = frame(chain.digest, { o: owner, r: record })
  return { bytes, chain: { record, owner, end: chain.end + bytes.length, digest } }
}

/**
 * What to write over the start of a chain of `length` bytes so it holds no record, and none of its bytes are left:
 * zeros, except the token of the store `owner` after the first zero byte.
 */
export function emptied(owner: string, length = HEADER_BYTES): Buffer {
  const bytes = Buffer.alloc(Math.max(HEADER_BYTES, length))
  bytes.write(owner, 1, 'latin1')
  return bytes
}

/** Reads a file's bytes. A file that holds no record names the store keeping it as a slot, if any. */
export function parse(bytes: Buffer): Content {
  if (bytes.length === 0 || bytes[0] === 0) {
    const owner = bytes.subarray(1, 17).toString('latin1')
    return /^[0-9a-f]{16}$/.test(owner) ? { kind: 'free', owner } : { kind: 'free' }
  }
  if (bytes.subarray(0, MAGIC.length).toString('latin1') !== MAGIC) {
    return {
      kind: 'corrupt',
      reason: `not a chain of records: it does not start with ${JSON.stringify(MAGIC)}`,
    }
  }
  let chain: Chain | undefined
  let at = 0
  let previous = ''
  for (;;) {
    const next = frameAt(bytes, at, previous, chain === undefined)
    if (!next) break
    chain = { record: next.payload.r, owner: next.payload.o, end: next.end, digest: next.digest }
    previous = next.digest
    at = next.end
  }
  return chain
    ? { kind: 'chain', chain }
    : { kind: 'corrupt', reason: 'a write-ahead record that does not verify' }
}

function frameAt(
  bytes: Buffer,
  at: number,
  previous: string,
  first: boolean,
): { payload: Payload; digest: string; end: number } | undefined {
  if (at + HEADER_BYTES > bytes.length) return undefined
  const header = bytes.subarray(at, at + HEADER_BYTES).toString('latin1')
  if (!header.startsWith(MAGIC) || header[HEADER_BYTES - 1] !== '\n') return undefined
  const length = Number(header.slice(MAGIC.length, MAGIC.length + 10))
  const digest = header.slice(MAGIC.length + 11, MAGIC.length + 43)
  const end = at + HEADER_BYTES + length
  if (!Number.isInteger(length) || end > bytes.length) return undefined
  const body = bytes.subarray(at + HEADER_BYTES, end)
  if (digestOf(previous, body) !== digest) return undefined
  try {
    const payload = JSON.parse(body.toString('utf8')) as Payload
    if (!isIntentRecord(payload?.r) || (first && typeof payload.n !== 'string')) return undefined
    return { payload: { o: typeof payload.o === 'string' ? payload.o : null, r: payload.r }, digest, end }
  } catch {
    return undefined
  }
}
