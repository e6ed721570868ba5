// Rendering is pure: on the server (renderToString runs no effects) the hooks render their initial state, and
// nothing reads the store, mints a key or sends a request.
import { createClient, type IntentStore, memoryStore } from '@oncely/client'
import { renderToString } from 'react-dom/server'
import { expect, it } from 'vitest'
import { OncelyProvider, useOncelyMutation, usePendingIntents } from '../src/index.js'

function Checkout() {
  const pay = useOncelyMutation<{ amount: number }>({
    path: '/v1/payments',
    intentId: () => 'checkout:cart_1',
  })
  const { intents, isLoading } = usePendingIntents()
  return (
    <p>
      {pay.status} {pay.attempts} {isLoading ? 'loading' : intents.length}
    </p>
  )
}

it('renders the initial state on the server without touching the store or the network', () => {
  const calls: string[] = []
  const inner = memoryStore()
  const logged = <T,>(name: string, run: () => T): T => {
    calls.push(name)
    return run()
  }
  const store: IntentStore = {
    get: (id) => logged('get', () => inner.get(id)),
    set: (record, options) => logged('set', () => inner.set(record, options)),
    delete: (id, options) => logged('delete', () => inner.delete(id, options)),
    list: () => logged('list', () => inner.list()),
  }
  const client = createClient({
    baseUrl: 'http://127.0.0.1:9',
    store,
    fetch: async () => {
      calls.push('fetch')
      return new Response(null, { status: 201 })
    },
  })
  const html = renderToString(
    <OncelyProvider client={client}>
      <Checkout />
    </OncelyProvider>,
  )
  expect(html).toBe('<p>idle<!-- --> <!-- -->0<!-- --> <!-- -->loading</p>')
  expect(calls).toEqual([])
})
