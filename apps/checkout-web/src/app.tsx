import { isHTTPError, type OncelyClient, type OncelyResponse, type PendingIntent } from '@oncely/client'
import { useOncelyMutation, useOnResumed, usePendingIntents } from '@oncely/react'
import { type FormEvent, useEffect, useState } from 'react'
import { cart } from './cart.js'
import type { FlakySwitch } from './flaky-fetch.js'
import { type Ledger, useLedger } from './ledger.js'

interface PaymentBody {
  amount: number
  currency: string
  reference?: string
}

interface Payment {
  id: string
  amount: number
  currency: string
  chargeId: string
}

/** One row of the intents table. */
interface IntentRow {
  id: string
  key: string
  attempts: number
  state: 'pending' | 'succeeded' | 'replayed' | 'failed'
  /** The payment, the error, or why it is still pending. */
  result: string
}

function settledRow(response: OncelyResponse): IntentRow {
  const payment = response.data as Payment
  return {
    id: response.intentId,
    key: response.key,
    attempts: response.attempts,
    state: response.replayed ? 'replayed' : 'succeeded',
    result: `payment ${payment.id}, ${payment.amount} ${payment.currency}, charge ${payment.chargeId}`,
  }
}

function failedRow(id: string, key: string, attempts: number, error: unknown): IntentRow {
  const result = isHTTPError(error)
    ? `${error.status} ${error.problem?.detail ?? error.message}`
    : error instanceof Error
      ? error.message
      : String(error)
  return { id, key, attempts, state: 'failed', result }
}

const plural = (n: number, word: string) => `${n} ${word}${n === 1 ? '' : 's'}`

/**
 * The page: a Pay form on `useOncelyMutation`, the intents it made (live, then finished), the intents pending in
 * IndexedDB (this tab's and other tabs'), and the ledger read from the API.
 */
export function App({ client, tenant, flaky }: { client: OncelyClient; tenant: string; flaky: FlakySwitch }) {
  const pay = useOncelyMutation<PaymentBody, Payment>({
    path: '/v1/payments',
    intentId: () => cart.intentId(),
  })
  const pending = usePendingIntents()
  const ledger = useLedger(tenant)
  const [finished, setFinished] = useState<ReadonlyMap<string, IntentRow>>(new Map())
  const [announcement, setAnnouncement] = useState('')
  const [flakyOn, setFlakyOn] = useState(flaky.on)
  const [resumed, setResumed] = useState(false)

  const finish = (row: IntentRow) => setFinished((rows) => new Map(rows).set(row.id, row))

  // Intents the page left pending (a reload, a closed tab) and the provider's resume finished.
  useOnResumed((intent) => {
    if (intent.outcome === 'settled') {
      const row = settledRow(intent.response)
      finish(row)
      cart.close(intent.id)
      setAnnouncement(`Confirmed after reload: ${row.result}`)
    } else {
      finish(failedRow(intent.id, intent.key, 0, intent.error))
      if (isHTTPError(intent.error)) cart.close(intent.id)
      setAnnouncement(`A payment left by an earlier page failed: ${String(intent.error)}`)
    }
  })

  useEffect(
    () =>
      client.on('storage-fallback', ({ reason }) =>
        setAnnouncement(`IndexedDB is unavailable (${reason}): intents will not survive a reload.`),
      ),
    [client],
  )

  // Joins the provider's resume on mount, to tell when it is over (the end-to-end test waits for it).
  useEffect(() => {
    let mounted = true
    void client
      .resume()
      .catch(() => {})
      .finally(() => {
        if (mounted) setResumed(true)
      })
    return () => {
      mounted = false
    }
  }, [client])
  useEffect(() => {
    if (resumed) document.body.dataset.resumed = 'true'
  }, [resumed])

  async function submit(event: FormEvent<HTMLFormElement>) {
    event.preventDefault()
    const data = new FormData(event.currentTarget)
    const reference = String(data.get('reference') ?? '').trim()
    const body: PaymentBody = {
      amount: Number(data.get('amount')),
      currency: String(data.get('currency') ?? ''),
      ...(reference ? { reference } : {}),
    }
    const intentId = cart.intentId()
    setAnnouncement('Paying…')
    try {
      const row = settledRow(await pay.mutateAsync(body))
      finish(row)
      cart.close(intentId)
      setAnnouncement(`Paid: ${row.result}`)
    } catch (error) {
      if (isHTTPError(error)) {
        // A final answer (such as a decline) closes the order; a pending intent keeps its cart until it settles.
        finish(failedRow(intentId, '', 0, error))
        cart.close(intentId)
        setAnnouncement(`Payment failed: ${String(error)}`)
      } else {
        setAnnouncement(`Not confirmed yet (${(error as Error).message}); it resumes on reload or reconnect.`)
      }
    }
  }

  const live = liveRows(pending.intents, pay, finished, resumed)
  const rows = [...live.reverse(), ...[...finished.values()].reverse()]
  const attempts = rows.reduce((sum, row) => sum + row.attempts, 0)

  return (
    <main>
      <h1>oncely checkout</h1>
      <p className="lead">
        Each Pay click is one intent: the key is minted once, written to IndexedDB before anything is sent,
        and every retry (or a reload) resends the same key and bytes. The server charges once and replays its
        answer.
      </p>

      <form id="checkout" onSubmit={submit}>
        <label>
          Amount (cents){' '}
          <input id="amount" name="amount" type="number" min="1" step="1" defaultValue="1250" required />
        </label>
        <label>
          Currency <input id="currency" name="currency" defaultValue="eur" pattern="[a-z]{3}" required />
        </label>
        <label>
          Reference <input id="reference" name="reference" maxLength={200} placeholder="optional" />
        </label>
        <button id="pay" type="submit" aria-busy={pay.status === 'pending'}>
          Pay
        </button>
      </form>

      <label className="switch">
        <input
          id="flaky"
          type="checkbox"
          checked={flakyOn}
          onChange={(event) => {
            flaky.on = event.currentTarget.checked
            setFlakyOn(flaky.on)
          }}
        />
        Flaky network: drop every response (the server still commits; off again after a reload)
      </label>
      <p id="notice" role="status">
        {announcement}
      </p>

      <h2 id="intents-title">Intents</h2>
      <table aria-labelledby="intents-title">
        <thead>
          <tr>
            <th scope="col">Key</th>
            <th scope="col">Attempts</th>
            <th scope="col">State</th>
            <th scope="col">Result</th>
          </tr>
        </thead>
        <tbody id="intents">
          {rows.map((row) => (
            <tr key={row.id} data-key={row.key} data-state={row.state}>
              <td className="key">{row.key}</td>
              <td className="attempts">{row.attempts}</td>
              <td className={`state state-${row.state}`}>{row.state}</td>
              <td className="result">{row.result}</td>
            </tr>
          ))}
        </tbody>
      </table>

      <h2>
        Pending in IndexedDB{' '}
        <span id="pending-count" className="count">
          {pending.intents.length}
        </span>
      </h2>
      {pending.error !== undefined && <p role="alert">Could not read IndexedDB: {String(pending.error)}</p>}
      <ul id="pending">
        {pending.intents.map((intent) => (
          <li key={intent.id} data-key={intent.key}>
            {intent.key}: {plural(intent.attempts, 'attempt')}
            {intent.lastError ? `, last error: ${intent.lastError.message}` : ''}
          </li>
        ))}
      </ul>

      <LedgerPanel tenant={tenant} ledger={ledger} attempts={attempts} />
    </main>
  )
}

/** Pending intents (from the store, this tab's and others'), with this page's live attempt and retry for its own. */
function liveRows(
  intents: readonly PendingIntent[],
  pay: ReturnType<typeof useOncelyMutation<PaymentBody, Payment>>,
  finished: ReadonlyMap<string, IntentRow>,
  resumed: boolean,
): IntentRow[] {
  const rows = new Map<string, IntentRow>()
  for (const intent of intents) {
    if (finished.has(intent.id)) continue
    const result =
      intent.state === 'expired'
        ? 'expired: outcome unknown, never resent'
        : intent.lastError
          ? `last error: ${intent.lastError.message}; resumes on reload or reconnect`
          : resumed
            ? 'waiting to resume'
            : 'resuming after reload'
    rows.set(intent.id, {
      id: intent.id,
      key: intent.key,
      attempts: intent.attempts,
      state: 'pending',
      result,
    })
  }
  // This page's own intent: what its mutation knows beyond the store (the retry under way, or why it stopped).
  const own =
    pay.status === 'pending'
      ? pay.nextRetryAt === undefined
        ? `attempt ${pay.attempts} sent`
        : `${pay.retryReason}; next attempt at ${new Date(pay.nextRetryAt).toLocaleTimeString()}`
      : pay.status === 'failed' && pay.resumable && rows.has(pay.intentId ?? '')
        ? `gave up for now (${pay.error.message}); resumes on reload or reconnect`
        : undefined
  if (own !== undefined && pay.intentId && pay.key && !finished.has(pay.intentId)) {
    rows.set(pay.intentId, {
      id: pay.intentId,
      key: pay.key,
      attempts: pay.attempts,
      state: 'pending',
      result: own,
    })
  }
  return [...rows.values()]
}

/** The tenant's payments and provider charges, next to the attempts the page made: the on-screen proof. */
function LedgerPanel({
  tenant,
  ledger,
  attempts,
}: {
  tenant: string
  ledger: Ledger | undefined
  attempts: number
}) {
  return (
    <section aria-labelledby="ledger-title" data-tenant={tenant}>
      <h2 id="ledger-title">
        Ledger <span className="count">for tenant {tenant}, read from the API</span>
      </h2>
      {ledger ? (
        <>
          <p
            id="ledger-summary"
            role="status"
            data-attempts={attempts}
            data-payments={ledger.totals.payments}
            data-charges={ledger.totals.charges}
          >
            {plural(attempts, 'attempt')}, {plural(ledger.totals.payments, 'payment')},{' '}
            {plural(ledger.totals.charges, 'charge')}
          </p>
          <div className="ledger">
            <LedgerTable
              id="ledger-payments"
              label="Payments"
              columns={['Payment', 'Amount', 'Charge']}
              rows={ledger.payments.map((p) => [p.id, `${p.amount} ${p.currency}`, p.chargeId])}
            />
            <LedgerTable
              id="ledger-charges"
              label="Provider charges"
              columns={['Provider charge', 'Amount', 'Status']}
              rows={ledger.charges.map((c) => [c.chargeId, `${c.amount} ${c.currency}`, c.status])}
            />
          </div>
        </>
      ) : (
        <p id="ledger-summary">Reading the ledger…</p>
      )}
    </section>
  )
}

/** One table of the ledger; each row's first cell is its unique id. */
function LedgerTable(props: { id: string; label: string; columns: string[]; rows: string[][] }) {
  return (
    <table aria-label={props.label}>
      <thead>
        <tr>
          {props.columns.map((column) => (
            <th key={column} scope="col">
              {column}
            </th>
          ))}
        </tr>
      </thead>
      <tbody id={props.id}>
        {props.rows.map((row) => (
          <tr key={row[0]}>
            {row.map((cell, i) => (
              <td key={props.columns[i]} className={i === 1 ? undefined : 'key'}>
                {cell}
              </td>
            ))}
          </tr>
        ))}
      </tbody>
    </table>
  )
}
