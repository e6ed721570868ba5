import { objectOptions, positiveInteger, refuseTestingOptions } from '../options/check.js'
import type { FaultOptions } from './faults.js'
import { DEFAULT_REPLAY_HEADERS, FORBIDDEN_REPLAY_HEADERS } from './response.js'
import type { EngineOptions, ExecuteInput, KeyId } from './types.js'

// Re-exported for the engine's and the HTTP core's modules, which import it from here.
export { positiveInteger }

export interface ResolvedOptions {
  leaseMs: number
  retentionMs: number
  maxResponseBytes: number
  unavailableRetryAfterMs: number
  replayHeaders: ReadonlySet<string>
  fenced: boolean
  reservation: 'row' | 'lock'
  /** Bounds of the replay cache, or null when it is off. */
  replayCache: { maxEntries: number; maxBytes: number; maxAgeMs: number; maxUnconfirmedMs: number } | null
}

function resolveReplayCache(
  value: EngineOptions<unknown>['replayCache'],
  fenced: boolean,
): ResolvedOptions['replayCache'] {
  if (value === false) return null
  if (value !== undefined && (typeof value !== 'object' || value === null)) {
    throw new TypeError('Expected `replayCache` to be false or an object.')
  }
  const maxEntries = positiveInteger('replayCache.maxEntries', value?.maxEntries ?? 10_000)
  const maxBytes = positiveInteger('replayCache.maxBytes', value?.maxBytes ?? 16_777_216)
  const maxAgeMs = positiveInteger('replayCache.maxAgeMs', value?.maxAgeMs ?? 60_000)
  const maxUnconfirmedMs = positiveInteger('replayCache.maxUnconfirmedMs', value?.maxUnconfirmedMs ?? 1_000)
  // Without fencing a finished record can be overwritten (that is what the chaos run must catch): cache nothing.
  return fenced ? { maxEntries, maxBytes, maxAgeMs, maxUnconfirmedMs } : null
}

function checkLeaseAndRetention(leaseMs: number, retentionMs: number, prefix = ''): void {
  if (retentionMs <= leaseMs) {
    throw new TypeError(
      `Expected \`${prefix}retentionMs\` (${retentionMs}) to exceed \`${prefix}leaseMs\` (${leaseMs}).`,
    )
  }
}

export function resolveOptions<Tx>(
  options: EngineOptions<Tx>,
  faults: FaultOptions<Tx> = {},
): ResolvedOptions {
  objectOptions('createEngine()', options)
  refuseTestingOptions('createEngine()', options, ['hooks', 'unsafe'], 'createEngineForTesting()')
  const leaseMs = positiveInteger('leaseMs', options.leaseMs ?? 30_000)
  const retentionMs = positiveInteger('retentionMs', options.retentionMs ?? 86_400_000)
  checkLeaseAndRetention(leaseMs, retentionMs)
  const replayHeaders = new Set<string>()
  for (const name of options.replayHeaders ?? DEFAULT_REPLAY_HEADERS) {
    const lower = typeof name === 'string' ? name.toLowerCase() : ''
    if (lower === '' || FORBIDDEN_REPLAY_HEADERS.has(lower)) {
      throw new TypeError(`Expected \`replayHeaders\` not to contain ${JSON.stringify(name)}.`)
    }
    replayHeaders.add(lower)
  }
  if (options.onEvent !== undefined && typeof options.onEvent !== 'function') {
    throw new TypeError('Expected `onEvent` to be a function.')
  }
  const fenced = faults.unsafe?.disableFencing !== true
  const reservation = options.reservation ?? 'lock'
  if (reservation !== 'row' && reservation !== 'lock') {
    throw new TypeError(`Expected \`reservation\` to be 'row' or 'lock', got ${JSON.stringify(reservation)}.`)
  }
  return {
    reservation,
    leaseMs,
    retentionMs,
    maxResponseBytes: positiveInteger('maxResponseBytes', options.maxResponseBytes ?? 1_048_576),
    unavailableRetryAfterMs: positiveInteger(
      'unavailableRetryAfterMs',
      options.unavailableRetryAfterMs ?? 1_000,
    ),
    replayHeaders,
    fenced,
    replayCache: resolveReplayCache(options.replayCache, fenced),
  }
}

/**
 * The longest `scope` and `operation`, in UTF-8 bytes. With a key of at most 255 characters, the three fit the key
 * table's primary-key index, whose entries Postgres caps at 2704 bytes; past that every insert of the key fails.
 */
export const MAX_NAME_BYTES = 512

/** The longest key, in characters (as the protocol's `Idempotency-Key` header allows). */
export const MAX_KEY_CHARACTERS = 255

/**
 * What is wrong with the strings that name a key record (and the fingerprint, when given), or `undefined`. A scope
 * or operation over {@link MAX_NAME_BYTES} is refused here, as a mistake in the caller, rather than by the index,
 * as a store failure on every request.
 */
export function recordIdProblem(input: KeyId & { fingerprint?: string }): string | undefined {
  for (const name of ['scope', 'operation', 'key', 'fingerprint'] as const) {
    if (name === 'fingerprint' && !('fingerprint' in input)) continue
    const value = input[name]
    if (typeof value !== 'string' || value.length === 0)
      return `Expected \`${name}\` to be a non-empty string.`
    // The key table has no CHECK on it (migration 005): the length it held is checked here, in characters.
    if (name === 'key' && value.length > MAX_KEY_CHARACTERS && [...value].length > MAX_KEY_CHARACTERS)
      return `Expected \`key\` to have at most ${MAX_KEY_CHARACTERS} characters, got ${[...value].length}.`
    if ((name === 'scope' || name === 'operation') && value.length * 3 > MAX_NAME_BYTES) {
      const bytes = Buffer.byteLength(value)
      if (bytes > MAX_NAME_BYTES)
        return `Expected \`${name}\` to have at most ${MAX_NAME_BYTES} bytes (UTF-8), got ${bytes}: it is part of the key table's index.`
    }
  }
  return undefined
}

/** Checks the strings that name a key record (and the fingerprint, when given) and returns the record's id. */
export function checkRecordId(input: KeyId & { fingerprint?: string }): KeyId {
  if (typeof input !== 'object' || input === null) throw new TypeError('Expected `input` to be an object.')
  const problem = recordIdProblem(input)
  if (problem) throw new TypeError(problem)
  return { scope: input.scope, operation: input.operation, key: input.key }
}

export function checkInput<Tx>(
  input: ExecuteInput<Tx>,
  defaults: ResolvedOptions,
): { leaseMs: number; retentionMs: number } {
  checkRecordId(input)
  if (typeof input.handler !== 'function') throw new TypeError('Expected `handler` to be a function.')
  if (input.wait !== undefined) positiveInteger('wait.timeoutMs', input.wait?.timeoutMs)
  const leaseMs = input.leaseMs === undefined ? defaults.leaseMs : positiveInteger('leaseMs', input.leaseMs)
  const retentionMs =
    input.retentionMs === undefined ? defaults.retentionMs : positiveInteger('retentionMs', input.retentionMs)
  checkLeaseAndRetention(leaseMs, retentionMs)
  return { leaseMs, retentionMs }
}
