// One attempt on a claimed key, as a sequence of named steps: the handler in the business transaction, then the
// finished record; or the rollback and what the failure leaves (a released key, a stored permanent failure); or the
// answer of an attempt that lost its key.
//
// The attempt holds exactly one connection, the claim's, from its reservation to its answer. Whatever it writes
// after the handler (the release, a stored failure, the inspection after losing its key) goes on that connection
// once its transaction ended, or, when that connection broke, only after giving it back. Asking the pool for a
// second connection while holding one hangs the process as soon as pool-size attempts do it at once.
import { ResponseTooLargeError } from '../errors.js'
import type { Database, Session } from '../store/database.js'
import { isLeaseLost } from '../store/queries.js'
import type { Claim, Exec, Inspection, ReservationProtocol } from '../store/reservation.js'
import { type Answers, type Sent, sentNow } from './answers.js'
import { defaultClassify, defaultRenderError, isRetryableResponse } from './classify.js'
import { AttemptContext } from './context.js'
import type { EngineEvents } from './events.js'
import type { EngineHooks } from './faults.js'
import { LazyAbort } from './lazy-abort.js'
import type { ResolvedOptions } from './options.js'
import type { ReplayCache } from './replay-cache.js'
import { normalizeResponse, tooLargeResponse } from './response.js'
import type { Durations } from './retry-after.js'
import type { ExecuteInput, KeyId, Outcome, StoredResponse } from './types.js'

/** What the keep-alive sends on a live attempt's transaction. */
const KEEP_ALIVE = { text: 'SELECT 1', values: [] }

/** What every attempt of one engine shares. */
export interface AttemptEnvironment<Tx> {
  readonly config: ResolvedOptions
  readonly hooks: EngineHooks<Tx>
  /** The store's datasource: for a statement after the attempt gave its broken connection back. */
  readonly database: Database<Tx>
  readonly cache: ReplayCache | undefined
  readonly durations: Durations
  readonly events: EngineEvents
  /** What the engine answers without an execution; and where a store error is reported (see `Answers`). */
  readonly answers: Answers<Tx>
}

/** Runs one attempt on a claimed key to its outcome; see the file's header. Create one per claim. */
export class Attempt<Tx, C extends Claim<Tx>> {
  readonly #env: AttemptEnvironment<Tx>
  readonly #input: ExecuteInput<Tx>
  readonly #protocol: ReservationProtocol<C>
  readonly #claim: C
  readonly #sent: Sent
  readonly #id: KeyId
  readonly #abort = new LazyAbort()
  readonly #started = Date.now()
  /** Whether the attempt ran without a key record (`failOpen`). */
  readonly #failedOpen: boolean
  /** The claim's session, until the attempt gives it back. */
  #session: Session<Tx> | undefined
  /** Whether the business transaction on the client is still open. */
  #open = true
  /** Why the client's connection broke (the first error says why; the socket's close follows it). */
  #broken: Error | undefined
  #keepAlive: ReturnType<typeof setTimeout> | undefined
  #renewing = false
  /** A keep-alive statement was sent and has not been answered yet. */
  #keepingAlive = false
  /** When the event loop last kept the lease (at first: when the reservation was sent). */
  #beat: number
  /**
   * True once the process was seen to have stopped for a whole lease (the keep-alive ran that late): the key may be
   * another attempt's by now, so the attempt stops renewing, and a broken connection means a lost lease.
   */
  #stalled = false

  constructor(
    env: AttemptEnvironment<Tx>,
    input: ExecuteInput<Tx>,
    protocol: ReservationProtocol<C>,
    claim: C,
    sent: Sent,
    failedOpen: boolean,
  ) {
    this.#env = env
    this.#input = input
    this.#protocol = protocol
    this.#claim = claim
    this.#sent = sent
    this.#id = claim.request.id
    this.#session = claim.session
    this.#failedOpen = failedOpen
    this.#beat = sent.wall
  }

  async run(): Promise<Outcome> {
    const { attempt, replaced } = this.#claim
    const { emit } = this.#env.events
    if (replaced === 'expired') emit?.({ type: 'expired', ...this.#id })
    else if (replaced === 'takeover') emit?.({ type: 'takeover', attempt, ...this.#id })
    if (!this.#failedOpen) emit?.({ type: 'reserved', attempt, ...this.#id })
    this.#claim.session.onBroken(this.#onBroken)
    this.#scheduleKeepAlive()
    let abandoned: Error | undefined
    try {
      return await this.#execute()
    } catch (error) {
      // A hook simulated a crash (or the adapter's handler wrapper threw): give up the attempt as it stands.
      abandoned = new Error('attempt abandoned')
      this.#abort.abort(error)
      throw error
    } finally {
      clearTimeout(this.#keepAlive)
      this.#keepAlive = undefined
      // Most attempts end committed: no rollback, and no promise for one.
      if (this.#open) await this.#rollback()
      this.#giveBack(abandoned)
    }
  }

  async #execute(): Promise<Outcome> {
    const { hooks, config } = this.#env
    const { attempt } = this.#claim
    const { tx } = this.#claim.session
    // The fault hooks are for tests (createEngineForTesting). Without one, no await: awaiting undefined still
    // allocates a promise and resumes a tick later.
    if (hooks.afterReserve) await hooks.afterReserve({ ...this.#id, attempt, tx })
    let response: StoredResponse
    try {
      const returned = await this.#input.handler(
        new AttemptContext(this.#env.database, this.#protocol, this.#claim, this.#id, this.#abort),
      )
      response = normalizeResponse(returned, config.replayHeaders)
      if (isRetryableResponse(response.status, returned.headers)) {
        const reason = response.status >= 500 ? 'server_error_response' : 'retryable_response'
        return await this.#release(reason, { response })
      }
    } catch (error) {
      return await this.#threw(error)
    }
    if (response.body.length > config.maxResponseBytes) {
      const tooLarge = new ResponseTooLargeError(response.body.length, config.maxResponseBytes)
      await this.#rollback()
      return await this.#storeFailure(tooLargeResponse(tooLarge), tooLarge)
    }
    if (hooks.beforeCommit) await hooks.beforeCommit({ ...this.#id, attempt, tx })
    return await this.#complete(response)
  }

  /** The handler threw: lost lease, retryable (release the key) or permanent (store the rendered failure). */
  async #threw(error: unknown): Promise<Outcome> {
    if (isLeaseLost(error)) this.#broken ??= error as Error
    // The rollback also shows a connection that broke before this attempt could listen to it.
    await this.#rollback()
    if (this.#lostLease()) return await this.#lost()
    // The store's connection broke: nothing of this attempt can be recorded, so it is retryable whatever the handler
    // threw, and it is answered with the store's failure. The handler's own error would be rendered by the framework
    // with its status, and a 4xx reads as final to the client while the key was never finished.
    if (this.#broken) return await this.#release('error', { error: this.#broken })
    const kind = (this.#input.classify ?? defaultClassify)(error)
    if (kind === 'retryable') return await this.#release('error', { error })
    const rendered = (this.#input.renderError ?? defaultRenderError)(error)
    return await this.#storeFailure(normalizeResponse(rendered, this.#env.config.replayHeaders))
  }

  /** Stores a permanent failure on the attempt's own connection (its transaction already rolled back). */
  async #storeFailure(response: StoredResponse, tooLarge?: ResponseTooLargeError): Promise<Outcome> {
    if (this.#broken) return await this.#release('error', { error: this.#broken })
    let stored: boolean
    try {
      stored = await this.#protocol.fail(this.#claim, response)
    } catch (error) {
      this.#broken ??= error as Error
      return this.#env.answers.unavailable(this.#env.answers.storeError(error, this.#id))
    }
    if (!stored) return await this.#fencedOut('in_progress')
    return this.#executed(response, 'failed_permanent', tooLarge)
  }

  /** Writes the finished record and commits, in the business transaction. */
  async #complete(response: StoredResponse): Promise<Outcome> {
    const status = response.status >= 400 ? 'failed_permanent' : 'succeeded'
    let completed: boolean
    try {
      completed = await this.#protocol.complete(this.#claim, status, response)
    } catch (error) {
      // The completion failed, or the commit, which may or may not have happened. Releasing is still safe: it only
      // matches a key still held under this claim, so a committed record is left alone and an uncommitted one is
      // freed at once. The connection is dropped, which also ends any open transaction.
      this.#broken ??= error as Error
      if (this.#lostLease()) return await this.#lost()
      this.#open = false
      const diagnosed = this.#env.answers.storeError(error, this.#id)
      await this.#protocol.release(this.#claim, this.#connection()).catch(() => {})
      return this.#env.answers.unavailable(diagnosed)
    }
    if (!completed) {
      await this.#rollback()
      return await this.#fencedOut('lease_expired')
    }
    this.#open = false
    this.#env.cache?.set(
      this.#id,
      this.#input.fingerprint,
      response,
      this.#claim.expiresInMs,
      this.#sent.at,
      this.#sent.wall,
      this.#claim.server,
    )
    const outcome = this.#executed(response, status)
    const { hooks } = this.#env
    if (hooks.afterCommit) await hooks.afterCommit({ ...this.#id, attempt: this.#claim.attempt })
    return outcome
  }

  #executed(
    response: StoredResponse,
    status: 'succeeded' | 'failed_permanent',
    tooLarge?: ResponseTooLargeError,
  ): Outcome {
    const { attempt } = this.#claim
    const durationMs = Date.now() - this.#started
    this.#env.durations.observe(this.#id.operation, durationMs)
    this.#env.events.emit?.({ type: 'executed', attempt, status: response.status, durationMs, ...this.#id })
    const outcome: Outcome & { kind: 'executed' } = { kind: 'executed', response, status, attempt }
    if (this.#failedOpen) outcome.failedOpen = true
    if (tooLarge) outcome.tooLarge = tooLarge
    return outcome
  }

  /** Frees the key after a retryable failure (the transaction rolled back), so the next attempt runs at once. */
  async #release(
    reason: 'error' | 'server_error_response' | 'retryable_response',
    detail: { error?: unknown; response?: StoredResponse },
  ): Promise<Outcome> {
    await this.#rollback()
    try {
      await this.#protocol.release(this.#claim, this.#connection())
      this.#env.events.emit?.({ type: 'released', attempt: this.#claim.attempt, reason, ...this.#id })
    } catch (error) {
      // The key stays held until its lease runs out; then the next attempt takes over.
      this.#broken ??= error as Error
      this.#env.answers.storeError(error, this.#id)
    }
    return { kind: 'retryable_failure', reason, ...detail }
  }

  /**
   * Postgres ended the transaction after it sat idle past the lease: nothing of this attempt committed, and another
   * may hold the key by now. Free what the claim left (fenced), then answer like any attempt that lost its lease.
   */
  async #lost(): Promise<Outcome> {
    this.#open = false
    await this.#protocol.release(this.#claim, this.#connection()).catch(() => {})
    return await this.#fencedOut('lease_expired')
  }

  /**
   * After the attempt lost its key: the record's answer when it finished (usually the winner's response), else
   * `whenBusy`: `lease_expired` for an attempt whose lease ran out, `in_progress` for one that found another
   * attempt on the key when it came to store its failure.
   */
  async #fencedOut(whenBusy: 'in_progress' | 'lease_expired'): Promise<Outcome> {
    const { attempt, request } = this.#claim
    this.#env.events.emit?.({ type: 'fenced_out', attempt, ...this.#id })
    const sent = sentNow()
    let found: Inspection
    try {
      found = await this.#protocol.inspect(request, this.#connection())
    } catch (error) {
      // After a lost lease the library may hand the inspection the connection Postgres closed under this attempt (a
      // library that rolls back through its own transaction callback is not told, and pools it again): once that
      // failure has shown, the library drops it, so the inspection is asked once more, on the pool (the attempt's
      // own connection, marked broken, given back first).
      if (!this.#lostLease())
        return this.#env.answers.unavailable(this.#env.answers.storeError(error, this.#id))
      this.#broken ??= error as Error
      try {
        found = await this.#protocol.inspect(request, this.#connection())
      } catch (again) {
        return this.#env.answers.unavailable(this.#env.answers.storeError(again, this.#id))
      }
    }
    const lost = { kind: 'lost', sent, attempt, leaseMs: request.leaseMs, whenBusy } as const
    return this.#env.answers.answerInspection(this.#id, request.fingerprint, found, lost) as Outcome
  }

  /**
   * Whether the attempt lost its lease: the process stalled for a whole lease (whether or not the datasource reported
   * what Postgres did meanwhile: a library that rolls back through its own transaction callback may report nothing
   * for a transaction Postgres already ended), or the connection broke because Postgres ended the transaction for
   * sitting idle past the lease (25P03), or it broke a whole lease since the attempt last kept it (the first error
   * seen may then be the socket's, not Postgres's reason).
   */
  #lostLease(): boolean {
    if (this.#stalled) return true
    if (this.#broken === undefined) return false
    return isLeaseLost(this.#broken) || Date.now() - this.#beat >= this.#claim.request.leaseMs
  }

  /** Rolls the business transaction back, once; a failure marks the connection broken. */
  async #rollback(): Promise<void> {
    if (!this.#open || !this.#session) return
    this.#open = false
    try {
      await this.#session.run(['ROLLBACK'])
    } catch (error) {
      this.#broken ??= error as Error
    }
  }

  /**
   * Where a statement after the transaction runs: the attempt's own session while it works, else (having given the
   * broken connection back first) a connection of the pool.
   */
  #connection(): Exec {
    const session = this.#session
    if (session && !this.#broken) return async (statement) => (await session.run([statement]))[0]!
    this.#giveBack()
    const { database } = this.#env
    return (statement) => database.query(statement)
  }

  /** Returns the connection to the pool, destroyed if it broke or sat in an abandoned transaction. */
  #giveBack(abandoned?: Error): void {
    const session = this.#session
    if (!session) return
    this.#session = undefined
    session.release(this.#broken ?? abandoned)
  }

  readonly #onBroken = (error: Error): void => {
    this.#broken ??= error
    this.#abort.abort(error)
    this.#env.answers.storeError(error, this.#id)
  }

  /**
   * Keeps a live attempt's lease while its handler runs: every `leaseMs / 3`, a statement on the business
   * transaction (so Postgres never sees it idle for the lease) and, where the protocol keeps the lease in the key's
   * row, a renewed deadline there. A stopped process sends neither, so it loses the key within about the lease.
   */
  #scheduleKeepAlive(): void {
    // The unfenced engine (the chaos suite's proof that fencing matters) goes without, like the lease guard.
    if (!this.#env.config.fenced || this.#failedOpen) return
    const everyMs = Math.max(1, Math.floor(this.#claim.request.leaseMs / 3))
    this.#keepAlive = setTimeout(Attempt.#keepLease, everyMs, this)
    this.#keepAlive.unref?.()
  }

  // Static, with the attempt as the timer's argument: no closure per attempt.
  static #keepLease<Tx, C extends Claim<Tx>>(attempt: Attempt<Tx, C>): void {
    attempt.#keep()
  }

  #keep(): void {
    const session = this.#session
    if (!session || !this.#open || this.#stalled) return
    const now = Date.now()
    if (now - this.#beat >= this.#claim.request.leaseMs) {
      // The process did not run for a whole lease: Postgres may have ended the transaction, and a takeover may be
      // under way. Renewing now could revive a lease another attempt is entitled to take: let it go instead.
      this.#stalled = true
      this.#abort.abort(
        new Error('The process stalled for longer than the lease; this attempt may have lost its key.'),
      )
      return
    }
    this.#beat = now
    // Queued behind any statement of the handler's, so one at a time: while one still waits, the connection is busy
    // and not idle, and a handler statement of many leases would otherwise pile them up on it. An error (an aborted
    // transaction) says nothing new.
    if (!this.#keepingAlive) {
      this.#keepingAlive = true
      session
        .run([KEEP_ALIVE])
        .catch(() => {})
        .finally(() => {
          this.#keepingAlive = false
        })
    }
    // On one connection nothing else reaches the key while this transaction holds it: nothing to renew.
    if (!this.#renewing && !this.#env.database.oneConnection) {
      this.#renewing = true
      this.#protocol
        .renew(this.#claim)
        .then(
          (held) => {
            if (!held) this.#abort.abort(new Error('Another attempt took over this key.'))
          },
          (error) => this.#env.answers.storeError(error, this.#id),
        )
        .finally(() => {
          this.#renewing = false
        })
    }
    this.#scheduleKeepAlive()
  }
}
