// The hooks in real Chromium with React Testing Library, against a real API server (@oncely/server on Postgres):
// IndexedDB stores, Web Locks, BroadcastChannel and real HTTP. A "reload" is a new client on the same IndexedDB
// database rendered in a new React root after the first is gone; a "tab" is a client with its own root.
import { createClient, isRetryExhaustedError, type OncelyClient, type ResumedIntent } from '@oncely/client'
import { indexedDbStore } from '@oncely/client/idb'
import {
  MutationCache,
  QueryClient,
  QueryClientProvider,
  useMutation,
  useMutationState,
  useQuery,
  useQueryClient,
} from '@tanstack/react-query'
import { act, cleanup, render, waitFor, within } from '@testing-library/react'
import { StrictMode, useState } from 'react'
import { afterEach, describe, expect, inject, it } from 'vitest'
import { userEvent } from 'vitest/browser'
import {
  OncelyProvider,
  oncelyMutationOptions,
  useInvalidateOnResumed,
  useOncelyMutation,
  useOnResumed,
  usePendingIntents,
  useResumedMutations,
} from '../../src/index.js'

const apiUrl = inject('apiUrl')
let databases = 0
const freshStore = () => `oncely-react-${Date.now()}-${databases++}`
const clients: OncelyClient[] = []

afterEach(async () => {
  cleanup()
  await Promise.all(clients.splice(0).map((client) => client.close()))
})

interface Order {
  amount: number
  /** Keeps the server busy inside the payment's transaction, so two drivers could overlap. */
  workMs?: number
}
interface Payment {
  id: string
  amount: number
}

/** What the server saw for `key`: the POSTs that carried it and the payments it executed. */
async function seen(key: string): Promise<{ attempts: string[]; payments: string[] }> {
  const get = async (path: string) => (await fetch(`${apiUrl}${path}?key=${encodeURIComponent(key)}`)).json()
  const requests = (await get('/test/requests')) as { attempt: string }[]
  return { attempts: requests.map((r) => r.attempt), payments: (await get('/test/payments')) as string[] }
}

/** A fetch that, while `drop.on`, waits for the real response (the server committed) and then loses it. */
function droppingFetch(drop: { on: boolean }): typeof fetch {
  return async (input, init) => {
    const response = await fetch(input, init)
    if (!drop.on) return response
    await response.body?.cancel()
    throw new TypeError('Failed to fetch')
  }
}

/** A client on the IndexedDB database `store`, as one page of one tab would create it. */
function tab(
  store: string,
  options: { drop?: { on: boolean }; retries?: number; maxDelayMs?: number } = {},
): OncelyClient {
  const client = createClient({
    baseUrl: apiUrl,
    store: indexedDbStore({ name: store }),
    ...(options.drop ? { fetch: droppingFetch(options.drop) } : {}),
    retry: { limit: options.retries ?? 3, minDelayMs: 10, maxDelayMs: options.maxDelayMs ?? 20 },
    resumeOnOnline: false,
  })
  clients.push(client)
  return client
}

function Checkout({ order, intentId }: { order: Order; intentId?: (order: Order) => string }) {
  const pay = useOncelyMutation<Order, Payment>({ path: '/v1/payments', intentId })
  const { intents, isLoading } = usePendingIntents()
  return (
    <section>
      <button type="button" onClick={() => pay.mutate(order)}>
        Pay
      </button>
      <p role="status" data-key={pay.key ?? ''} data-attempts={pay.attempts}>
        {pay.status === 'settled' && `paid ${pay.data.id}${pay.replayed ? ' (replayed)' : ''}`}
        {pay.status === 'failed' && `failed: ${pay.error.name}${pay.resumable ? ', will resume' : ''}`}
        {pay.status === 'pending' && 'paying'}
      </p>
      <p data-testid="pending">{isLoading ? 'loading' : `${intents.length} pending`}</p>
    </section>
  )
}

function ResumedLog() {
  const [outcomes, setOutcomes] = useState<ResumedIntent[]>([])
  useOnResumed((intent) => setOutcomes((list) => [...list, intent]))
  return (
    <ul aria-label="resumed">
      {outcomes.map((intent) => (
        <li key={intent.id} data-key={intent.key}>
          {intent.outcome === 'settled'
            ? `confirmed ${(intent.response.data as Payment).id}${intent.response.replayed ? ' (replayed)' : ''}`
            : `failed ${String(intent.error)}`}
        </li>
      ))}
    </ul>
  )
}

const statusOf = (root: HTMLElement) => within(root).getByRole('status')
const pendingOf = (root: HTMLElement) => within(root).getByTestId('pending').textContent

describe('hooks in Chromium', () => {
  it('a mutation whose answers were lost survives a reload, and its result reaches the resumed view', async () => {
    const store = freshStore()
    const first = tab(store, { drop: { on: true }, retries: 2 })
    const page1 = render(
      <OncelyProvider client={first} resumeOnMount={false}>
        <Checkout order={{ amount: 11 }} />
      </OncelyProvider>,
    )
    await userEvent.click(within(page1.container).getByRole('button', { name: 'Pay' }))
    // Three attempts and their back-offs: over waitFor's default second on a machine running two suites at once.
    await waitFor(
      () => expect(statusOf(page1.container).textContent).toBe('failed: RetryExhaustedError, will resume'),
      { timeout: 10_000 },
    )
    const key = statusOf(page1.container).dataset.key!
    expect(key).toMatch(/^[0-9a-f-]{36}$/)
    expect(statusOf(page1.container).dataset.attempts).toBe('3')
    await waitFor(() => expect(pendingOf(page1.container)).toBe('1 pending'))
    expect(await seen(key)).toMatchObject({ attempts: ['1', '2', '3'], payments: [expect.any(String)] })
    page1.unmount()
    await first.close()

    const second = tab(store)
    const page2 = render(
      <OncelyProvider client={second}>
        <ResumedLog />
        <Checkout order={{ amount: 11 }} />
      </OncelyProvider>,
    )
    const resumed = within(page2.container).getByRole('list', { name: 'resumed' })
    await waitFor(() => expect(resumed.querySelector(`li[data-key="${key}"]`)).not.toBeNull(), {
      timeout: 10_000,
    })
    const { attempts, payments } = await seen(key)
    expect(attempts).toEqual(['1', '2', '3', '4'])
    expect(payments).toHaveLength(1)
    expect(resumed.textContent).toBe(`confirmed ${payments[0]} (replayed)`)
    await waitFor(() => expect(pendingOf(page2.container)).toBe('0 pending'))
  })

  it('a double click with an intentId sends one intent; both clicks get its answer', async () => {
    const cart = crypto.randomUUID()
    const client = tab(freshStore())
    const view = render(
      <OncelyProvider client={client}>
        <Checkout order={{ amount: 12, workMs: 200 }} intentId={() => `checkout:${cart}`} />
      </OncelyProvider>,
    )
    await userEvent.dblClick(within(view.container).getByRole('button', { name: 'Pay' }))
    await waitFor(() => expect(statusOf(view.container).textContent).toMatch(/^paid \d+$/))
    const { attempts, payments } = await seen(statusOf(view.container).dataset.key!)
    expect(attempts).toEqual(['1'])
    expect(statusOf(view.container).textContent).toBe(`paid ${payments[0]}`)
  })

  it('without an intentId, each click is an intent of its own', async () => {
    const client = tab(freshStore())
    const keys: string[] = []
    client.on('attempt', ({ key }) => keys.push(key))
    const view = render(
      <OncelyProvider client={client}>
        <Checkout order={{ amount: 13, workMs: 100 }} />
      </OncelyProvider>,
    )
    await userEvent.dblClick(within(view.container).getByRole('button', { name: 'Pay' }))
    await waitFor(() => expect(statusOf(view.container).textContent).toMatch(/^paid/))
    await waitFor(() => expect(new Set(keys).size).toBe(2))
    // The status shows the first intent paid; the second may still be in flight, so each key's payment is awaited
    // (a second payment for a key would keep this failing until the timeout).
    for (const key of keys) await waitFor(async () => expect((await seen(key)).payments).toHaveLength(1))
  })

  it('under StrictMode, rendering sends and stores nothing, the provider resumes once, and a click sends once', async () => {
    const store = freshStore()
    const seeded = tab(store, { drop: { on: true }, retries: 0 })
    const left = await seeded.request({ path: '/v1/payments', json: { amount: 14 } }).catch((error) => error)
    expect(isRetryExhaustedError(left)).toBe(true)
    const leftKey = (left as { key: string }).key
    await seeded.close()

    const client = tab(store)
    const sent: string[] = []
    client.on('attempt', ({ key }) => sent.push(key))
    const view = render(
      <StrictMode>
        <OncelyProvider client={client}>
          <ResumedLog />
          <Checkout order={{ amount: 15 }} />
        </OncelyProvider>
      </StrictMode>,
    )
    const resumed = within(view.container).getByRole('list', { name: 'resumed' })
    await waitFor(() => expect(resumed.children).toHaveLength(1))
    await waitFor(() => expect(pendingOf(view.container)).toBe('0 pending'))
    expect(sent).toEqual([leftKey])
    expect((await seen(leftKey)).attempts).toEqual(['1', '2'])

    // Re-rendering (StrictMode renders twice each time) mints nothing and sends nothing.
    for (let i = 0; i < 3; i++) {
      view.rerender(
        <StrictMode>
          <OncelyProvider client={client}>
            <ResumedLog />
            <Checkout order={{ amount: 15 + i }} />
          </OncelyProvider>
        </StrictMode>,
      )
    }
    expect(await client.pending()).toEqual([])
    expect(sent).toEqual([leftKey])

    await userEvent.click(within(view.container).getByRole('button', { name: 'Pay' }))
    await waitFor(() => expect(statusOf(view.container).textContent).toMatch(/^paid/))
    expect(sent).toHaveLength(2)
    expect((await seen(sent[1]!)).attempts).toEqual(['1'])
    expect(resumed.children).toHaveLength(1)
  })

  it('two tabs see each other’s pending intents and drive one intent once', async () => {
    const store = freshStore()
    const drop = { on: true }
    const tabA = tab(store, { drop, retries: 0 })
    const tabB = tab(store)
    const [rootA, rootB] = [document.createElement('div'), document.createElement('div')]
    document.body.append(rootA, rootB)
    render(
      <OncelyProvider client={tabA}>
        <Checkout order={{ amount: 16, workMs: 300 }} />
        <ResumedLog />
      </OncelyProvider>,
      { container: rootA },
    )
    render(
      <OncelyProvider client={tabB}>
        <Checkout order={{ amount: 17 }} />
        <ResumedLog />
      </OncelyProvider>,
      { container: rootB },
    )
    await waitFor(() => expect(pendingOf(rootB)).toBe('0 pending'))

    await userEvent.click(within(rootA).getByRole('button', { name: 'Pay' }))
    await waitFor(() => expect(statusOf(rootA).textContent).toBe('failed: RetryExhaustedError, will resume'))
    const key = statusOf(rootA).dataset.key!
    // Tab B never touched this intent: it learns of it from tab A's announcement.
    await waitFor(() => expect(pendingOf(rootB)).toBe('1 pending'))

    // Both tabs come back online at once; the server is slow, so both try to drive it while it is in flight.
    drop.on = false
    const outcomes = (await act(() => Promise.all([tabA.resume(), tabB.resume()]))).flat()
    expect(outcomes.filter((o) => o.outcome === 'settled')).toHaveLength(1)
    expect(outcomes.filter((o) => o.outcome !== 'settled' && o.outcome !== 'skipped')).toEqual([])
    const { attempts, payments } = await seen(key)
    expect(attempts).toEqual(['1', '2'])
    expect(payments).toHaveLength(1)
    await waitFor(() => expect([pendingOf(rootA), pendingOf(rootB)]).toEqual(['0 pending', '0 pending']))
    rootA.remove()
    rootB.remove()
  })
})

/** A payments list (a query) and a Pay button (a TanStack mutation through oncely). */
function Payments({ client, onFetch }: { client: OncelyClient; onFetch: () => void }) {
  const queryClient = useQueryClient()
  const list = useQuery({
    queryKey: ['payments'],
    queryFn: async () => {
      onFetch()
      return Date.now()
    },
  })
  const pay = useMutation({
    ...oncelyMutationOptions<Order, Payment>({ client, path: '/v1/payments' }),
    onSuccess: () => queryClient.invalidateQueries({ queryKey: ['payments'] }),
  })
  useInvalidateOnResumed(queryClient, (intent) =>
    new URL(intent.url).pathname === '/v1/payments' ? [['payments']] : [],
  )
  return (
    <section>
      <button type="button" onClick={() => pay.mutate({ amount: 18 })}>
        Pay
      </button>
      <p role="status" data-key={pay.data?.key ?? ''}>
        {pay.status} {list.status}
      </p>
    </section>
  )
}

describe('TanStack Query', () => {
  it('useMutation with oncelyMutationOptions: oncely owns the retries, and a resumed intent invalidates queries', async () => {
    const store = freshStore()
    // A default of 3 retries, as many apps set: the helper's `retry: 0` must win, or each retry is a new intent.
    const newQueryClient = () =>
      new QueryClient({ defaultOptions: { mutations: { retry: 3, retryDelay: 1 } } })
    const drop = { on: true }
    const first = tab(store, { drop, retries: 1 })
    let fetches = 0
    const page1 = render(
      <QueryClientProvider client={newQueryClient()}>
        <OncelyProvider client={first} resumeOnMount={false}>
          <Payments client={first} onFetch={() => fetches++} />
        </OncelyProvider>
      </QueryClientProvider>,
    )
    await userEvent.click(within(page1.container).getByRole('button', { name: 'Pay' }))
    await waitFor(() => expect(statusOf(page1.container).textContent).toBe('error success'))
    const [intent, ...others] = await first.pending()
    expect(others).toEqual([])
    expect((await seen(intent!.key)).attempts).toEqual(['1', '2'])
    page1.unmount()
    await first.close()

    const second = tab(store)
    const before = fetches
    const page2 = render(
      <QueryClientProvider client={newQueryClient()}>
        <OncelyProvider client={second}>
          <Payments client={second} onFetch={() => fetches++} />
        </OncelyProvider>
      </QueryClientProvider>,
    )
    // One fetch on mount, one more once the resumed intent settled.
    await waitFor(() => expect(fetches).toBe(before + 2))
    expect(await second.pending()).toEqual([])
    expect((await seen(intent!.key)).payments).toHaveLength(1)
    page2.unmount()
  })
})

/** A TanStack mutation through oncely that shows its state, and logs what each render saw. */
function TrackedPay({ client, log }: { client: OncelyClient; log: string[] }) {
  const pay = useMutation({
    ...oncelyMutationOptions<Order, Payment>({ client, path: '/v1/payments' }),
    mutationKey: ['pay'],
  })
  log.push(`${pay.status} ${pay.failureCount} ${pay.failureReason?.name ?? '-'}`)
  return (
    <section>
      <button type="button" onClick={() => pay.mutate({ amount: 19 })}>
        Pay
      </button>
      <p role="status" data-key={pay.data?.key ?? ''}>
        {`${pay.status} ${pay.failureCount}`}
      </p>
    </section>
  )
}

/** What the mutation cache holds for the key `['pay']`, as useMutationState sees it. */
function PayMutations() {
  const states = useMutationState({
    filters: { mutationKey: ['pay'] },
    select: (m) =>
      `${m.state.status} ${(m.state.data as { data?: Payment } | undefined)?.data?.id ?? '-'} ${
        (m.meta?.oncely as { key?: string } | undefined)?.key ?? '-'
      }`,
  })
  return (
    <ul aria-label="mutations">
      {states.map((state) => (
        <li key={state}>{state}</li>
      ))}
    </ul>
  )
}

/** Puts the payments that resume() finishes into the mutation cache under `['pay']`. */
function DeliverResumed() {
  useResumedMutations(useQueryClient(), (intent) =>
    new URL(intent.url).pathname === '/v1/payments' ? ['pay'] : undefined,
  )
  return null
}

describe('TanStack Query shows oncely’s work', () => {
  it('failureCount and failureReason follow oncely’s retries while the mutation is pending, on one key', async () => {
    const drop = { on: true }
    const client = tab(freshStore(), { drop, retries: 1000, maxDelayMs: 50 })
    const log: string[] = []
    const view = render(
      <QueryClientProvider client={new QueryClient()}>
        <TrackedPay client={client} log={log} />
      </QueryClientProvider>,
    )
    await userEvent.click(within(view.container).getByRole('button', { name: 'Pay' }))
    await waitFor(() => expect(log).toContain('pending 2 NetworkError'))
    drop.on = false
    await waitFor(() => expect(statusOf(view.container).textContent).toBe('success 0'))
    const key = statusOf(view.container).dataset.key!
    const { attempts, payments } = await seen(key)
    expect(attempts.length).toBeGreaterThanOrEqual(3)
    expect(payments).toHaveLength(1)
    expect(await client.pending()).toEqual([])
  })

  it('a result that resume() delivers after a reload reaches the mutation cache', async () => {
    const store = freshStore()
    const first = tab(store, { drop: { on: true }, retries: 1 })
    const left = await first.request({ path: '/v1/payments', json: { amount: 20 } }).catch((error) => error)
    expect(isRetryExhaustedError(left)).toBe(true)
    const key = (left as { key: string }).key
    await first.close()

    const second = tab(store)
    const settled: unknown[] = []
    const queryClient = new QueryClient({
      mutationCache: new MutationCache({ onSuccess: (data) => void settled.push(data) }),
    })
    const view = render(
      <QueryClientProvider client={queryClient}>
        <OncelyProvider client={second}>
          <DeliverResumed />
          <PayMutations />
        </OncelyProvider>
      </QueryClientProvider>,
    )
    const list = within(view.container).getByRole('list', { name: 'mutations' })
    await waitFor(() => expect(list.children).toHaveLength(1))
    const { payments } = await seen(key)
    expect(payments).toHaveLength(1)
    expect(list.textContent).toBe(`success ${payments[0]} ${key}`)
    expect(settled).toMatchObject([{ key, replayed: true, data: { id: payments[0] } }])
  })
})
