import {
  headerNames,
  objectOption,
  objectOptions,
  objectOrFlag,
  oneOf,
  optionalFunction,
  positiveInteger,
  refuseTestingOptions,
  requiredFunction,
} from '../options/check.js'
import type { ReserveRequest } from '../store/reservation.js'
import type { FaultOptions } from './faults.js'
import { DEFAULT_REPLAY_HEADERS, FORBIDDEN_REPLAY_HEADERS } from './response.js'
import type { EngineOptions, ExecuteInput, KeyId } from './types.js'

// Re-exported for the engine's modules, which import it from here.
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
  const given = objectOrFlag('replayCache', value, false)
  if (given === false) return null
  const maxEntries = positiveInteger('replayCache.maxEntries', given?.maxEntries ?? 10_000)
  const maxBytes = positiveInteger('replayCache.maxBytes', given?.maxBytes ?? 16_777_216)
  const maxAgeMs = positiveInteger('replayCache.maxAgeMs', given?.maxAgeMs ?? 60_000)
  const maxUnconfirmedMs = positiveInteger('replayCache.maxUnconfirmedMs', given?.maxUnconfirmedMs ?? 1_000)
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
  const names =
    options.replayHeaders === undefined
      ? DEFAULT_REPLAY_HEADERS
      : headerNames('replayHeaders', options.replayHeaders)
  for (const name of names) {
    const lower = name.toLowerCase()
    if (FORBIDDEN_REPLAY_HEADERS.has(lower)) {
      throw new TypeError(`Expected \`replayHeaders\` not to contain ${JSON.stringify(name)}.`)
    }
    replayHeaders.add(lower)
  }
  optionalFunction('onEvent', options.onEvent)
  const fenced = faults.unsafe?.disableFencing !== true
  const reservation = oneOf('reservation', options.reservation ?? 'lock', ['row', 'lock'])
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
  objectOption('input', input)
  const problem = recordIdProblem(input)
  if (problem) throw new TypeError(problem)
  return { scope: input.scope, operation: input.operation, key: input.key }
}

/** Checks an execution's input and returns what its reservation asks for. */
export function reserveRequestOf<Tx>(input: ExecuteInput<Tx>, defaults: ResolvedOptions): ReserveRequest {
  objectOption('input', input)
  const problem = recordIdProblem(input)
  if (problem) throw new TypeError(problem)
  requiredFunction('handler', input.handler)
  if (input.wait !== undefined) positiveInteger('wait.timeoutMs', input.wait?.timeoutMs)
  const leaseMs = input.leaseMs === undefined ? defaults.leaseMs : positiveInteger('leaseMs', input.leaseMs)
  const retentionMs =
    input.retentionMs === undefined ? defaults.retentionMs : positiveInteger('retentionMs', input.retentionMs)
  checkLeaseAndRetention(leaseMs, retentionMs)
  return {
    id: { scope: input.scope, operation: input.operation, key: input.key },
    fingerprint: input.fingerprint,
    leaseMs,
    retentionMs,
    requestHeaders: input.requestHeaders ?? null,
  }
}
