/**
 * The checkout page. One cart id per order names the intent (`intentId: checkout:<cart>`), so a double click joins
 * the payment already under way instead of starting a second one; the cart id is renewed once the order has a
 * final answer. Pending intents left by a reload or a closed tab are resumed as soon as the page loads.
 */
import { createClient, isHTTPError, type OncelyResponse } from '@oncely/client'
import { indexedDbStore } from '@oncely/client/idb'
import { flakyFetch } from './flaky-fetch.js'
import { type IntentRow, renderIntents, renderPending } from './intents-view.js'
import './style.css'

// The demo API's stand-in for authentication: the bearer token is the tenant id.
const TENANT = 'demo'
const CART_KEY = 'oncely-demo:cart'

interface Payment {
  id: string
  amount: number
  currency: string
  chargeId: string
}

const $ = <T extends HTMLElement>(id: string) => document.getElementById(id) as T
const form = $<HTMLFormElement>('checkout')
const flaky = $<HTMLInputElement>('flaky')
const notice = $<HTMLElement>('notice')

const client = createClient({
  baseUrl: window.location.origin,
  store: indexedDbStore({ name: 'oncely-checkout-demo' }),
  headers: () => ({ authorization: `Bearer ${TENANT}` }),
  fetch: flakyFetch(() => flaky.checked),
  retry: { minDelayMs: 500, maxDelayMs: 4_000 },
  timeoutMs: 15_000,
})

const rows = new Map<string, IntentRow>()

function upsert(id: string, key: string, patch: Partial<IntentRow>): void {
  const row = rows.get(id) ?? { id, key, attempts: 0, state: 'pending' as const, result: '' }
  rows.set(id, { ...row, ...patch })
  renderIntents($('intents'), rows.values())
}

async function refreshPending(): Promise<void> {
  const pending = await client.pending()
  renderPending(
    $('pending'),
    $('pending-count'),
    pending.map((p) => ({ key: p.key, attempts: p.attempts, lastError: p.lastError?.message })),
  )
}

function showSettled(id: string, response: OncelyResponse): void {
  const payment = response.data as Payment
  upsert(id, response.key, {
    attempts: response.attempts,
    state: response.replayed ? 'replayed' : 'succeeded',
    result: `payment ${payment.id}, ${payment.amount} ${payment.currency}, charge ${payment.chargeId}`,
  })
}

function showFailure(id: string, key: string, error: unknown): void {
  const message = isHTTPError(error)
    ? `${error.status} ${error.problem?.detail ?? error.message}`
    : error instanceof Error
      ? error.message
      : String(error)
  upsert(id, key, { state: 'failed', result: message })
}

client.on('attempt', ({ id, key, attempt }) => {
  upsert(id, key, { attempts: attempt, state: 'pending', result: `attempt ${attempt} sent` })
  void refreshPending()
})
client.on('retry', ({ id, key, attempt, delayMs, reason }) => {
  upsert(id, key, {
    attempts: attempt,
    state: 'pending',
    result: `${reason}; retrying in ${Math.round(delayMs)} ms`,
  })
  void refreshPending()
})
client.on('failed', ({ id, key, error, pending }) => {
  if (pending)
    upsert(id, key, { state: 'pending', result: `gave up for now (${error.message}); resumes on reload` })
  void refreshPending()
})
client.on('storage-fallback', ({ reason }) => {
  notice.textContent = `IndexedDB is unavailable (${reason}): intents will not survive a reload.`
})

function cartId(): string {
  let cart = localStorage.getItem(CART_KEY)
  if (!cart) {
    cart = crypto.randomUUID()
    localStorage.setItem(CART_KEY, cart)
  }
  return cart
}

form.addEventListener('submit', async (event) => {
  event.preventDefault()
  const data = new FormData(form)
  const reference = String(data.get('reference') ?? '').trim()
  const body = {
    amount: Number(data.get('amount')),
    currency: String(data.get('currency') ?? ''),
    ...(reference ? { reference } : {}),
  }
  const intentId = `checkout:${cartId()}`
  try {
    const response = await client.request({ path: '/v1/payments', json: body, intentId })
    showSettled(intentId, response)
    localStorage.removeItem(CART_KEY)
  } catch (error) {
    const known = rows.get(intentId)
    showFailure(intentId, known?.key ?? '', error)
    // A final answer (such as a decline) closes the order; a pending intent keeps its cart until it settles.
    if (isHTTPError(error)) localStorage.removeItem(CART_KEY)
  } finally {
    void refreshPending()
  }
})

// Resume what a previous page left pending: same key, same bytes, so the server replays instead of charging again.
async function resumeOnLoad(): Promise<void> {
  for (const intent of await client.pending()) {
    upsert(intent.id, intent.key, {
      attempts: intent.attempts,
      state: 'pending',
      result: 'resuming after reload',
    })
  }
  await refreshPending()
  for (const outcome of await client.resume()) {
    if (outcome.outcome === 'settled') {
      showSettled(outcome.id, outcome.response)
      if (outcome.id === `checkout:${localStorage.getItem(CART_KEY)}`) localStorage.removeItem(CART_KEY)
    } else if (outcome.outcome === 'failed') {
      showFailure(outcome.id, outcome.key, outcome.error)
    }
  }
  await refreshPending()
  document.body.dataset.resumed = 'true'
}

void resumeOnLoad()
