// The hooks as a React Native app uses them: no DOM, no BroadcastChannel, no IndexedDB, intents in AsyncStorage
// (an in-memory implementation of its interface), rendered by react-test-renderer against a real oncely server.
import { createClient, type OncelyClient, type ResumedIntent } from '@oncely/client'
import { type AsyncStorageLike, asyncStorageStore } from '@oncely/client/react-native'
import { useState } from 'react'
import { create, type ReactTestRenderer } from 'react-test-renderer'
import { afterAll, afterEach, beforeAll, expect, it, vi } from 'vitest'
import {
  OncelyProvider,
  type UseOncelyMutationResult,
  useOncelyMutation,
  useOnResumed,
  usePendingIntents,
} from '../src/index.js'
import { startApiServer } from './support/api-server.js'

// react-test-renderer is deprecated for app tests (React logs it once), but it is the DOM-less renderer React
// ships, which is the point here: nothing may rely on a DOM.

let server: Awaited<ReturnType<typeof startApiServer>>
beforeAll(async () => {
  server = await startApiServer('react_native')
})
afterAll(() => server?.close())
const clients: OncelyClient[] = []
const renderers: ReactTestRenderer[] = []
afterEach(async () => {
  for (const renderer of renderers.splice(0)) renderer.unmount()
  await Promise.all(clients.splice(0).map((client) => client.close()))
  vi.unstubAllGlobals()
})

/** AsyncStorage's interface over a Map, shared by the "app launches" of one test like the device's storage. */
function memoryAsyncStorage(): AsyncStorageLike {
  const items = new Map<string, string>()
  return {
    getItem: async (key) => items.get(key) ?? null,
    setItem: async (key, value) => {
      items.set(key, value)
    },
    removeItem: async (key) => {
      items.delete(key)
    },
  }
}

interface Rendered {
  pay: UseOncelyMutationResult<{ id: string }, { amount: number }>
  pending: number | undefined
  resumed: ResumedIntent[]
}

/** The app's screen: a Pay mutation, the pending intents, and what resume() finished. Reports each render. */
function Screen({ onRender }: { onRender: (rendered: Rendered) => void }) {
  const pay = useOncelyMutation<{ amount: number }, { id: string }>({ path: '/v1/payments' })
  const { intents, isLoading } = usePendingIntents()
  const [resumed, setResumed] = useState<ResumedIntent[]>([])
  useOnResumed((intent) => setResumed((list) => [...list, intent]))
  onRender({ pay, pending: isLoading ? undefined : intents.length, resumed })
  return null
}

/**
 * Launches the app: a provider (which resumes on mount) around the screen. Returns a reader of what the screen
 * last rendered. Nothing is wrapped in act(): updates arrive from the network, as in the app.
 */
function launch(client: OncelyClient): () => Rendered {
  let latest: Rendered | undefined
  renderers.push(
    create(
      <OncelyProvider client={client}>
        <Screen
          onRender={(rendered) => {
            latest = rendered
          }}
        />
      </OncelyProvider>,
    ),
  )
  return () => {
    if (!latest) throw new Error('not rendered yet')
    return latest
  }
}

const until = (check: () => boolean) =>
  vi.waitFor(
    () => {
      if (!check()) throw new Error('not yet')
    },
    { timeout: 10_000, interval: 10 },
  )

it('works with asyncStorageStore and no DOM: a lost answer stays pending, and the next launch resumes it', async () => {
  vi.stubGlobal('BroadcastChannel', undefined)
  expect(typeof document).toBe('undefined')
  const storage = memoryAsyncStorage()
  const drop = { on: true }
  const first = createClient({
    baseUrl: server.url,
    store: asyncStorageStore(storage),
    retry: { limit: 1, minDelayMs: 5, maxDelayMs: 10 },
    fetch: async (input, init) => {
      const response = await fetch(input, init)
      if (!drop.on) return response
      await response.body?.cancel()
      throw new TypeError('Network request failed') // React Native's fetch error
    },
  })
  clients.push(first)
  const app1 = launch(first)
  await until(() => app1().pending === 0)
  app1().pay.mutate({ amount: 21 })
  await until(() => app1().pay.status === 'failed')
  const failed = app1().pay
  expect(failed).toMatchObject({ status: 'failed', resumable: true, attempts: 2 })
  await until(() => app1().pending === 1)
  const key = failed.key!
  renderers.pop()?.unmount()
  await first.close()

  const second = createClient({ baseUrl: server.url, store: asyncStorageStore(storage) })
  clients.push(second)
  const app2 = launch(second)
  await until(() => app2().resumed.length === 1 && app2().pending === 0)
  const [resumed] = app2().resumed
  expect(resumed).toMatchObject({ key, outcome: 'settled', method: 'POST' })
  const response = (resumed as Extract<ResumedIntent, { outcome: 'settled' }>).response
  expect(response).toMatchObject({ status: 201, replayed: true, attempts: 3 })
  const payments = (await (await fetch(`${server.url}/test/payments?key=${key}`)).json()) as string[]
  expect(payments).toEqual([(response.data as { id: string }).id])
})
