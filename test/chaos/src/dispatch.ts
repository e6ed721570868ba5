/**
 * Feeding the plan to the workers: normal intents through the SDK, probes raw with their original's key once they are
 * ready (see `readiness` in `run`).
 */
import type { PlannedIntent } from './generator.js'

export type Command =
  | { type: 'request'; intent: string; body: PlannedIntent['body'] }
  | {
      type: 'probe'
      intent: string
      of: string
      kind: string
      key: string
      body: PlannedIntent['body']
      again?: boolean
      firstAttempt?: number
    }
/** The probes the generator plans (the driver sends `failover-replay` ones after a failover, the nemesis its bursts). */
export type ProbeIntentKind = Exclude<PlannedIntent['kind'], 'normal' | 'failover-replay' | 'saturation'>
/** The fault each probe kind is counted as. */
export const PROBE_FAULTS = {
  'changed-payload': 'changed-payload',
  reordered: 'reordered-payload',
  'expired-replay': 'expired-replay',
  'expired-changed-payload': 'expired-changed-payload',
} as const satisfies Record<ProbeIntentKind, string>
/** `send` now, `wait` for a later turn, or `never` (its key can no longer be what the probe needs). */
export type Readiness = 'send' | 'wait' | 'never'

/**
 * Sends the plan in order, one every `spacingMs`. A probe waits until it is ready (see `readiness` in `run`): its
 * original has settled, so the key is already taken when it arrives (a probe that overtook its original would itself
 * be the first use of the key, and the original would rightly be the one refused), and its key lives or has expired
 * as the probe needs. A probe still waiting at `probeDeadline`, or one that can never be ready, is returned unsent,
 * so a hard fault mix cannot stretch the fault phase.
 */
export async function dispatch(
  plan: PlannedIntent[],
  io: {
    spacingMs: number
    probeDeadline: number
    /** The originals that have not settled never will (the drain is over). */
    final: boolean
    keys: ReadonlyMap<string, string>
    readiness(intent: PlannedIntent, final: boolean): Promise<Readiness>
    send(intent: PlannedIntent, command: Command): boolean
    probeSent(intent: PlannedIntent): void
  },
): Promise<PlannedIntent[]> {
  const queue = [...plan]
  const late: PlannedIntent[] = []
  while (queue.length > 0) {
    const intent = queue.shift()!
    if (intent.kind === 'normal') {
      // A worker being restarted cannot take it now; it goes to the back of the queue.
      if (!io.send(intent, { type: 'request', intent: intent.id, body: intent.body })) queue.push(intent)
    } else {
      const ready = await io.readiness(intent, io.final)
      const command = {
        type: 'probe' as const,
        intent: intent.id,
        of: intent.of!,
        kind: intent.kind,
        key: io.keys.get(intent.of!)!,
        body: intent.body,
      }
      if (ready === 'send' && io.send(intent, command)) {
        io.probeSent(intent)
      } else if (ready === 'never') {
        late.push(intent)
      } else if (Date.now() < io.probeDeadline) {
        queue.push(intent)
      } else {
        late.push(intent)
      }
    }
    if (queue.length > 0) await new Promise((r) => setTimeout(r, io.spacingMs))
  }
  return late
}
