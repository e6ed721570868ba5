/**
 * Outbox → JetStream → inbox under crashes: a producer enqueues messages in business transactions while several
 * dispatcher processes publish them to a real JetStream stream and a consumer process applies them through the
 * inbox. Dispatchers die between publish and mark (armed per incarnation from the seed) and are SIGKILLed by the
 * driver at seeded moments; the consumer dies between commit and ack and is SIGKILLed at seeded moments. Every
 * process is restarted until the job is done. The check: one effect row per message id, none missing, none
 * unasked for, every row published, JetStream holding each id once, and publish attempts above the message count
 * (re-publishes really happened).
 */
import { randomUUID } from 'node:crypto'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { AckPolicy, jetstreamManager } from '@nats-io/jetstream'
import { connect, nanos } from '@nats-io/transport-node'
import { createEngine, migrate, postgresStore } from '@oncely/server'
import { enqueue } from '@oncely/server/outbox'
import { createTestDatabase } from '@oncely/test-support'
import { type ExitInfo, ManagedProcess } from '../processes.js'
import type { Random } from '../random.js'
import { type ScenarioResult, sleep, waitFor } from './services.js'

export const OUTBOX_FAULTS = [
  'crash-dispatcher-after-publish',
  'kill-dispatcher',
  'crash-consumer-after-commit',
  'kill-consumer',
] as const

export interface OutboxScenarioOptions {
  random: Random
  natsUrl: string
  /** Where the processes' logs go. */
  logDir: string
  /** @default 60 */
  messages?: number
  /** @default 3 */
  dispatchers?: number
  /** Time to finish after the last enqueue before the run counts as stuck. @default 45_000 */
  settleTimeoutMs?: number
}

const here = (file: string) => fileURLToPath(new URL(file, import.meta.url))
const TS_CHILD = ['--conditions=@oncely/source', '--import', 'tsx']

export async function runOutboxScenario(options: OutboxScenarioOptions): Promise<ScenarioResult> {
  const started = Date.now()
  const { random, natsUrl, logDir } = options
  const messages = options.messages ?? 60
  const faults: Record<string, number> = Object.fromEntries(OUTBOX_FAULTS.map((kind) => [kind, 0]))
  const violations: string[] = []
  const plan = random.fork('outbox')
  const run = randomUUID().replaceAll('-', '').slice(0, 12)
  const stream = `ONCELY_CHAOS_${run}`
  const subject = `oncely.chaos.${run}`
  const durable = 'billing'

  const db = await createTestDatabase('chaos-layers-outbox', { max: 8 })
  const nc = await connect({ servers: natsUrl })
  const jsm = await jetstreamManager(nc)
  const processes: ManagedProcess[] = []
  let stopping = false
  try {
    await migrate(db.pool)
    await db.pool.query('CREATE TABLE effects (message_id text NOT NULL, pid integer NOT NULL)')
    await jsm.streams.add({ name: stream, subjects: [`${subject}.>`], duplicate_window: nanos(120_000) })
    await jsm.consumers.add(stream, {
      durable_name: durable,
      ack_policy: AckPolicy.Explicit,
      ack_wait: nanos(1_000),
    })

    const env = { DATABASE_URL: db.url, NATS_URL: natsUrl, STREAM: stream, DURABLE: durable }
    /** Restarts a process after every exit the driver did not ask for, with the next arming. */
    const supervise = (proc: ManagedProcess) => {
      processes.push(proc)
      return proc
    }
    const restartOnExit = (get: () => ManagedProcess) => (info: ExitInfo) => {
      if (stopping) return
      // Only SIGKILLs are injected: any other death is a bug in the layer (or the scenario), not a fault.
      if (info.signal !== 'SIGKILL') violations.push(`${get().name} exited by itself (code ${info.code})`)
      setTimeout(() => {
        if (!stopping && !get().running)
          void get()
            .start()
            .catch(() => {})
      }, 50)
    }
    // Dispatchers: the first incarnation dies after a seeded number of publishes, the second half the time, and every
    // incarnation until the kind has happened once (so it happens in every run, not by luck).
    const dispatchers = Array.from({ length: options.dispatchers ?? 3 }, (_, i) => {
      const arming = plan.fork(`dispatcher-${i}`)
      let incarnation = 0
      const proc: ManagedProcess = supervise(
        new ManagedProcess({
          name: `dispatcher-${i + 1}`,
          args: [...TS_CHILD, here('dispatcher-child.ts')],
          env: () => {
            incarnation++
            const armed =
              incarnation === 1 ||
              faults['crash-dispatcher-after-publish'] === 0 ||
              (incarnation === 2 && arming.chance(0.5))
            return { ...env, DIE_AFTER_PUBLISHES: String(armed ? arming.int(1, 4) : 0) }
          },
          ready: { line: /^ready$/ },
          logDir,
          onLine: (line) => {
            if (line === 'ONCELY_CHAOS crash after-publish') faults['crash-dispatcher-after-publish']!++
          },
          onExit: restartOnExit(() => proc),
        }),
      )
      return proc
    })
    const consumerArming = plan.fork('consumer')
    let consumerIncarnation = 0
    const consumer: ManagedProcess = supervise(
      new ManagedProcess({
        name: 'consumer',
        args: [...TS_CHILD, here('consumer-child.ts')],
        env: () => {
          consumerIncarnation++
          const armed =
            consumerIncarnation === 1 ||
            faults['crash-consumer-after-commit'] === 0 ||
            (consumerIncarnation === 2 && consumerArming.chance(0.5))
          return { ...env, DIE_AFTER_COMMITS: String(armed ? consumerArming.int(1, 5) : 0) }
        },
        ready: { line: /^ready$/ },
        logDir,
        onLine: (line) => {
          if (line === 'ONCELY_CHAOS crash after-commit') faults['crash-consumer-after-commit']!++
        },
        onExit: restartOnExit(() => consumer),
      }),
    )
    await Promise.all([...dispatchers, consumer].map((proc) => proc.start()))

    // The nemesis: SIGKILL a running dispatcher or the consumer at seeded moments while the producer runs.
    const nemesis = plan.fork('nemesis')
    const enqueueGapMs = 80
    const kills = [
      ...Array.from({ length: 2 }, () => ({ target: 'dispatcher' as const, atMs: nemesis.int(500, 4_000) })),
      { target: 'consumer' as const, atMs: nemesis.int(500, 4_000) },
    ]
    const nemesisDone = Promise.all(
      kills.map(async ({ target, atMs }) => {
        await sleep(atMs)
        // Retry until a target is running (it may be restarting after a crash of its own).
        for (let tries = 0; tries < 100 && !stopping; tries++) {
          const proc = target === 'consumer' ? consumer : nemesis.pick(dispatchers)
          if (proc.running) {
            faults[target === 'consumer' ? 'kill-consumer' : 'kill-dispatcher']!++
            await proc.kill()
            return
          }
          await sleep(100)
        }
      }),
    )

    // The producer: each message in its own business transaction through the engine, trickled over a few seconds.
    const engine = createEngine({ store: postgresStore({ pool: db.pool }) })
    const ids: string[] = []
    for (let n = 0; n < messages; n++) {
      const outcome = await engine.execute({
        scope: 'chaos',
        operation: 'POST /orders',
        key: `order-${n}`,
        fingerprint: 'f',
        handler: async ({ tx }) => {
          ids.push(
            await enqueue(tx, {
              topic: `${subject}.orders`,
              payload: { order: n },
              aggregateKey: `order-${n % 8}`,
            }),
          )
          return { status: 201 }
        },
      })
      if (outcome.kind !== 'executed') violations.push(`enqueue of order ${n} answered ${outcome.kind}`)
      await sleep(enqueueGapMs)
    }
    await nemesisDone

    const effectCount = async () =>
      (await db.pool.query('SELECT count(DISTINCT message_id)::int AS n FROM effects')).rows[0].n as number
    await waitFor(
      `${messages} effects`,
      async () => (await effectCount()) >= messages,
      options.settleTimeoutMs ?? 45_000,
    ).catch((error: Error) => violations.push(error.message))
    // Let the outbox marks land (a message may be consumed before its dispatcher marked it).
    await waitFor(
      'every outbox row published',
      async () =>
        (await db.pool.query("SELECT count(*)::int AS n FROM oncely.outbox WHERE status <> 'published'"))
          .rows[0].n === 0,
      10_000,
    ).catch((error: Error) => violations.push(error.message))
    stopping = true
    await Promise.all(processes.map((proc) => proc.dispose()))

    // The checker: one effect per message id, none missing, none unasked for.
    const { rows } = await db.pool.query<{ message_id: string; n: number }>(
      'SELECT message_id, count(*)::int AS n FROM effects GROUP BY message_id',
    )
    const effects = new Map(rows.map((row) => [row.message_id, row.n]))
    for (const id of ids) {
      const n = effects.get(id) ?? 0
      if (n !== 1) violations.push(`message ${id} has ${n} effect rows, expected 1`)
    }
    for (const id of effects.keys())
      if (!ids.includes(id)) violations.push(`effect for unknown message ${id}`)
    const outbox = await db.pool.query<{ attempts: number; unpublished: number }>(
      "SELECT coalesce(sum(attempts), 0)::int AS attempts, count(*) FILTER (WHERE status <> 'published')::int AS unpublished FROM oncely.outbox",
    )
    const attempts = outbox.rows[0]?.attempts ?? 0
    if (attempts <= messages) {
      violations.push(`publish attempts ${attempts} <= messages ${messages}: no re-publish was exercised`)
    }
    const inStream = (await jsm.streams.info(stream)).state.messages
    if (inStream !== messages) {
      violations.push(
        `the stream holds ${inStream} messages for ${messages} ids: a re-publish was not deduplicated`,
      )
    }
    return {
      faults,
      violations,
      durationMs: Date.now() - started,
      stats: {
        messages,
        publishAttempts: attempts,
        streamMessages: inStream,
        dispatcherStarts: dispatchers.reduce((sum, proc) => sum + proc.starts, 0),
        consumerStarts: consumer.starts,
      },
    }
  } finally {
    stopping = true
    await Promise.all(processes.map((proc) => proc.dispose().catch(() => {})))
    await jsm.streams.delete(stream).catch(() => {})
    await nc.close()
    await db.drop()
  }
}

/** Where a scenario's logs go by default: next to the suite's run directories (git-ignored). */
export const defaultLogDir = (label: string) =>
  join(
    fileURLToPath(new URL('../../runs/', import.meta.url)),
    `${new Date().toISOString().replaceAll(':', '-')}-${label}`,
  )
