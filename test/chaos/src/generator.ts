/**
 * The generator: the run's intents, decided up front from the seed, so a seed always means the same workload.
 *
 * Each intent's `reference` is its id: that is how the checker finds its effects in the ledger. The SDK derives
 * each key from the intent id. Probes reuse an earlier intent's key (the driver learns it from the history): a
 * `changed-payload` probe changes the amount and gets its own reference (it must be refused with 422 and leave
 * nothing behind); a `reordered` probe sends the original body with its members in another
 * order (canonically equal, so it must get the original's stored response); an `expired-replay` probe sends the
 * original body again once the original's key has expired (the driver waits for that), so the server treats it as a
 * new request and only the ledger's natural key stands between it and a second payment. It must get the original's
 * answer. An `expired-changed-payload` probe waits the same way but changes the amount and gets its own reference: a
 * new request to the server too, which the provider refuses for good (the key's charge was for another amount), so
 * it must be answered 422, stored, and leave nothing behind. An original is the target of at most one probe that
 * needs its key expired, and of no other probe after it (a later probe would renew the key that one needs expired).
 */
import { TEST_CARDS } from '@oncely/payments-api/src/provider.ts'
import type { IntentKind, PaymentBody } from './history.js'
import type { Random } from './random.js'

export interface PlannedIntent {
  id: string
  tenant: string
  kind: IntentKind
  /** The original intent, for probes. */
  of?: string
  body: PaymentBody
  /**
   * Which worker issues it (probes go to their original's worker, after it, so the original is settled or in flight);
   * -1 for the driver's own (`saturation`).
   */
  worker: number
}

export interface PlanOptions {
  intents: number
  workers: number
  /** Share of intents that are `changed-payload` probes. @default 0.05 */
  changedPayloadRate?: number
  /** Share of intents that are `reordered` probes. @default 0.05 */
  reorderedRate?: number
  /** Share of intents that are `expired-replay` probes. @default 0.03 */
  expiredReplayRate?: number
  /** Share of intents that are `expired-changed-payload` probes. @default 0.01 */
  expiredChangedPayloadRate?: number
  /** Share of normal intents whose amount is above 1,000,000, which the provider declines (402). @default 0.05 */
  declineRate?: number
}

/** The demo declines amounts above this with 402. */
export const DECLINE_ABOVE = 1_000_000
const CURRENCIES = ['eur', 'usd', 'gbp']
/** How many originals come before the first forced probe. */
const FORCED_PROBES_AFTER = 3

/** Plans the run's intents. Pure: the same stream and options give the same plan. */
export function planIntents(random: Random, options: PlanOptions): PlannedIntent[] {
  const changedRate = options.changedPayloadRate ?? 0.05
  const reorderedRate = options.reorderedRate ?? 0.05
  const expiredRate = options.expiredReplayRate ?? 0.03
  const expiredChangedRate = options.expiredChangedPayloadRate ?? 0.01
  const declineRate = options.declineRate ?? 0.05
  const plan: PlannedIntent[] = []
  const originals: PlannedIntent[] = []
  // Originals that no probe targeted yet (a probe that needs an expired key takes one, and no probe after it).
  const unprobed = new Set<PlannedIntent>()
  // Each enabled probe kind at least once, early (once a few originals exist), so a short run probes each.
  const owed = new Set<IntentKind>()
  if (changedRate > 0) owed.add('changed-payload')
  if (reorderedRate > 0) owed.add('reordered')
  if (expiredRate > 0) owed.add('expired-replay')
  if (expiredChangedRate > 0) owed.add('expired-changed-payload')
  for (let n = 1; n <= options.intents; n++) {
    const id = `i${String(n).padStart(5, '0')}`
    const draw = random.next()
    const due = originals.length >= FORCED_PROBES_AFTER ? [...owed][0] : undefined
    let kind: IntentKind =
      due ??
      (draw < changedRate
        ? 'changed-payload'
        : draw < changedRate + reorderedRate
          ? 'reordered'
          : draw < changedRate + reorderedRate + expiredRate
            ? 'expired-replay'
            : draw < changedRate + reorderedRate + expiredRate + expiredChangedRate
              ? 'expired-changed-payload'
              : 'normal')
    const needsExpiry = needsExpiredKey(kind)
    const candidates = needsExpiry ? [...unprobed] : originals
    const original = candidates.length > 0 ? random.pick(candidates) : undefined
    if (!original) kind = 'normal'
    owed.delete(kind)
    if (original && kind !== 'normal') {
      unprobed.delete(original)
      if (needsExpiry) originals.splice(originals.indexOf(original), 1)
    }
    if (original && kind === 'expired-replay') {
      plan.push({ ...probe(id, original, 'expired-replay'), body: { ...original.body } })
      continue
    }
    if (original && (kind === 'changed-payload' || kind === 'expired-changed-payload')) {
      const amount = original.body.amount === 1 ? 2 : original.body.amount - 1
      plan.push({
        ...probe(id, original, kind),
        body: { amount, currency: original.body.currency, reference: id },
      })
      continue
    }
    if (original && kind === 'reordered') {
      const { amount, currency, reference } = original.body
      plan.push({ ...probe(id, original, 'reordered'), body: { reference, currency, amount } as PaymentBody })
      continue
    }
    const amount = random.chance(declineRate)
      ? random.int(DECLINE_ABOVE + 1, 2 * DECLINE_ABOVE)
      : random.int(1, 100_000)
    const worker = random.int(0, options.workers - 1)
    const intent: PlannedIntent = {
      id,
      tenant: tenantOf(worker),
      kind: 'normal',
      body: { amount, currency: random.pick(CURRENCIES), reference: id },
      worker,
    }
    plan.push(intent)
    originals.push(intent)
    unprobed.add(intent)
  }
  return plan
}

/** Whether a probe of `kind` is sent only once its original's key has expired. */
export function needsExpiredKey(kind: IntentKind): boolean {
  return kind === 'expired-replay' || kind === 'expired-changed-payload'
}

/** Each worker is one device of one tenant: the SDK resolves credentials per client, not per intent. */
export function tenantOf(worker: number): string {
  return `tenant-${worker + 1}`
}

function probe(id: string, original: PlannedIntent, kind: IntentKind) {
  return { id, tenant: original.tenant, kind, of: original.id, worker: original.worker }
}

/**
 * What each request of a pool-saturating burst makes the demo's provider do (its test cards): `declined` throws a 402
 * from the handler, `slow` outlives the lease, `processing-error` loses the first answer after the charge (503, then
 * a retry), `plain` charges.
 */
export const BURST_FLAVORS = ['declined', 'slow', 'processing-error', 'plain'] as const
export type BurstFlavor = (typeof BURST_FLAVORS)[number]

const FLAVOR_CARDS: Record<BurstFlavor, string> = {
  declined: TEST_CARDS.declined,
  slow: TEST_CARDS.slow,
  'processing-error': TEST_CARDS.processingError,
  plain: '4242424242424242',
}
/** Of every ten requests of a burst: mostly the failure paths, which each want a second connection. */
const FLAVOR_MIX: readonly BurstFlavor[] = [
  'declined',
  'declined',
  'declined',
  'declined',
  'slow',
  'slow',
  'processing-error',
  'processing-error',
  'plain',
  'plain',
]

/** The tenant of the saturation bursts (the workers' tenants are `tenant-<n>`). */
export const BURST_TENANT = 'tenant-burst'

/**
 * Plans one pool-saturating burst: `size` payments with fresh keys and ids `s<round>-<n>`, each flavor in its share
 * of {@link FLAVOR_MIX} (each at least once from ten requests on), in a seeded order. Pure.
 */
export function planBurst(
  random: Random,
  options: { round: number; size: number },
): Array<PlannedIntent & { flavor: BurstFlavor }> {
  const flavors = Array.from({ length: options.size }, (_, i) => FLAVOR_MIX[i % FLAVOR_MIX.length]!)
  for (let i = flavors.length - 1; i > 0; i--) {
    const j = random.int(0, i)
    ;[flavors[i], flavors[j]] = [flavors[j]!, flavors[i]!]
  }
  return flavors.map((flavor, n) => {
    const id = `s${String(options.round).padStart(3, '0')}-${String(n + 1).padStart(3, '0')}`
    return {
      id,
      tenant: BURST_TENANT,
      kind: 'saturation',
      flavor,
      body: {
        amount: random.int(1, 100_000),
        currency: random.pick(CURRENCIES),
        reference: id,
        card: FLAVOR_CARDS[flavor],
      },
      worker: -1,
    }
  })
}
