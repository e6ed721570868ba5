/**
 * The history: everything that happened in a run, one JSON object per line, in the order the driver saw it.
 *
 * Jepsen's vocabulary: an operation is invoked, then completes `ok` (it happened), `fail` (it definitely did not
 * happen) or `info` (nobody knows: a timeout, a crash). Here there are two levels of operation: the user's intent
 * (one key, settled once) and each HTTP attempt the client made for it. Faults and process lifecycle are recorded
 * in the same stream so a violation can be read next to what caused it. An event's `index` is its 1-based line
 * number in history.jsonl.
 */
import { closeSync, openSync, readFileSync, writeSync } from 'node:fs'

/** Jepsen's completion types, plus `invoke`. */
export type Phase = 'invoke' | 'ok' | 'fail' | 'info'

/** The body the generator sends to `POST /v1/payments`. */
export interface PaymentBody {
  amount: number
  currency: string
  reference?: string
  /** One of the demo provider's test cards (`saturation` intents): a decline, a slow charge, a processing error. */
  card?: string
}

/** An HTTP response as the client saw it. */
export interface ObservedResponse {
  status: number
  body: unknown
}

/**
 * Why the generator made this intent. `normal` intents have their own key. The probes reuse an earlier intent's key:
 * `changed-payload` with a different body (the server must answer 422 and do nothing), `reordered` with the same
 * body, members in another order (canonically equal, so it must replay the stored response), `expired-replay` with
 * the same body once the key has expired (a new request to the server, which must still answer as it did the first
 * time and book nothing new), `expired-changed-payload` with another amount once the key has expired (a new request
 * that the provider refuses, since the key's charge was for another amount: it must be answered 422, stored, and book
 * nothing), `failover-replay` with the same body right after a failover (the driver sends one for
 * each intent acknowledged just before it: the key and its effect must have survived together or been lost together).
 * `saturation` intents are the pool-saturating bursts of the nemesis: fresh keys, sent by the driver straight to one
 * instance, each answered within a bound (see {@link AttemptEvent.boundMs}).
 */
export type IntentKind =
  | 'normal'
  | 'changed-payload'
  | 'reordered'
  | 'expired-replay'
  | 'expired-changed-payload'
  | 'failover-replay'
  | 'saturation'

interface EventBase {
  /** 1-based line number in history.jsonl, assigned by the writer. */
  index: number
  /** Wall-clock milliseconds since the epoch, when the driver recorded the event. */
  time: number
  /** The process the event is about: `driver`, `worker-2`, `api-1`, `proxy-api-1`, ... */
  process: string
}

/** One user intent. `invoke` carries the request; the completion carries the final response or the error. */
export interface IntentEvent extends EventBase {
  type: 'intent'
  phase: Phase
  intent: string
  /** The tenant (the bearer token). */
  tenant: string
  /**
   * The idempotency key. The SDK derives it from the intent id, so an `invoke` made through it may not carry it;
   * the first attempt does.
   */
  key?: string
  /** On `invoke` only. */
  kind?: IntentKind
  /** On `invoke` only: the body as sent (member order matters for `reordered` probes). */
  body?: PaymentBody
  /** For probes: the intent whose key is reused. */
  of?: string
  /** On `ok` and `fail` when a response was received. */
  response?: ObservedResponse
  /** On `fail` and `info`: why. */
  error?: string
  /**
   * On `ok` and `fail` with a response: when the worker received the answer, by its own clock (ms since the epoch).
   * `time` is when the driver read the report, which can be seconds later on a loaded machine, and for an outcome a
   * restarted worker reports from its store (it died between receiving the answer and reporting it), much later.
   */
  receivedAt?: number
}

/** One HTTP attempt of an intent. `ok` means a response arrived (any status); `info` means none did. */
export interface AttemptEvent extends EventBase {
  type: 'attempt'
  phase: Phase
  intent: string
  key: string
  attempt: number
  response?: ObservedResponse
  error?: string
  /** On `invoke`: when the worker sent the attempt, by its own clock (ms since the epoch). */
  sentAt?: number
  /**
   * On `invoke` of a request sent straight to an instance (not through a fault proxy): the instance (`api-2`), and
   * how long its answer may take ({@link HealthEvent} has the same). The liveness rules judge these.
   */
  target?: string
  boundMs?: number
  /** On the completion of a request sent straight to an instance: when its answer, or its connection's end, came. */
  receivedAt?: number
}

/**
 * One `GET /healthz` of the liveness monitor, straight to an instance, recorded when it ended: answered (`ok`, any
 * status), failed (`info`: the connection was refused or reset), or still waiting when the run ended (`info` without
 * `receivedAt`; the event's `time` is then when the monitor gave up).
 */
export interface HealthEvent extends EventBase {
  type: 'health'
  phase: 'ok' | 'info'
  /** The instance (`api-1`) and the pid of the incarnation the probe went to. */
  target: string
  pid?: number
  sentAt: number
  receivedAt?: number
  status?: number
  error?: string
  /** How long the answer may take. */
  boundMs: number
}

/** A fault the nemesis or a proxy injected. */
export interface FaultEvent extends EventBase {
  type: 'fault'
  /** The fault kind, as named in docs/chaos.md (`drop-request`, `kill-server`, ...). */
  fault: string
  /** What it hit: a process name, a proxy name, a connection. */
  target: string
  /** `start` and `stop` for faults with a duration (a pause, a partition); `once` for instantaneous ones. */
  phase: 'start' | 'stop' | 'once'
  detail?: Record<string, unknown>
}

/** A process started, became ready or exited. */
export interface ProcessEvent extends EventBase {
  type: 'process'
  action: 'start' | 'ready' | 'exit'
  pid?: number
  code?: number | null
  signal?: string | null
}

/** After the final drain, a worker reports the intents still pending in its store. */
export interface DrainEvent extends EventBase {
  type: 'drain'
  pending: string[]
}

export type HistoryEvent = IntentEvent | AttemptEvent | FaultEvent | ProcessEvent | DrainEvent | HealthEvent

type DistributiveOmit<T, K extends PropertyKey> = T extends unknown ? Omit<T, K> : never

/** An event before the writer numbers and timestamps it. */
export type NewEvent = DistributiveOmit<HistoryEvent, 'index' | 'time'> & { time?: number }

/** An event as a worker reports it: the driver adds the process name, index and time. */
export type ReportedEvent = DistributiveOmit<HistoryEvent, 'index' | 'time' | 'process'>

/** Appends events to a JSON lines file, synchronously, so a driver crash loses nothing it already recorded. */
export class HistoryWriter {
  readonly file: string
  readonly #fd: number
  readonly #events: HistoryEvent[] = []
  readonly #now: () => number

  /**
   * @param file Created or truncated.
   * @param now Clock, injectable for tests. @default Date.now
   */
  constructor(file: string, now: () => number = () => Date.now()) {
    this.file = file
    this.#fd = openSync(file, 'w')
    this.#now = now
  }

  /** Records an event and returns it with its index and time. */
  append(event: NewEvent): HistoryEvent {
    const full = { ...event, index: this.#events.length + 1, time: event.time ?? this.#now() } as HistoryEvent
    writeSync(this.#fd, `${JSON.stringify(full)}\n`)
    this.#events.push(full)
    return full
  }

  /** Everything recorded so far, in order. */
  get events(): readonly HistoryEvent[] {
    return this.#events
  }

  close(): void {
    closeSync(this.#fd)
  }
}

/** Parses a history written by {@link HistoryWriter}; blank lines are ignored, a malformed line throws. */
export function parseHistory(text: string): HistoryEvent[] {
  const events: HistoryEvent[] = []
  const lines = text.split('\n')
  for (let i = 0; i < lines.length; i++) {
    const line = lines[i]!.trim()
    if (line === '') continue
    try {
      events.push(JSON.parse(line) as HistoryEvent)
    } catch (error) {
      throw new SyntaxError(`history line ${i + 1} is not JSON: ${(error as Error).message}`)
    }
  }
  return events
}

/** Reads and parses a history file. */
export function readHistory(file: string): HistoryEvent[] {
  return parseHistory(readFileSync(file, 'utf8'))
}
