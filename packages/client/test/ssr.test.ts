import { afterEach, expect, it, vi } from 'vitest'

const GLOBALS = ['window', 'document', 'navigator', 'indexedDB', 'localStorage', 'fetch', 'crypto'] as const

afterEach(() => {
  vi.restoreAllMocks()
})

it('touches no browser global, storage or network when its modules are imported (sideEffects: false holds)', async () => {
  const touched: string[] = []
  const saved = GLOBALS.map((name) => [name, Object.getOwnPropertyDescriptor(globalThis, name)] as const)
  for (const [name, descriptor] of saved) {
    Object.defineProperty(globalThis, name, {
      configurable: true,
      get() {
        touched.push(name)
        return descriptor?.get ? descriptor.get.call(globalThis) : descriptor?.value
      },
    })
  }
  try {
    vi.resetModules()
    await import('../src/index.js')
    await import('../src/stores/idb.js')
    await import('../src/stores/node.js')
    await import('../src/stores/async-storage.js')
  } finally {
    for (const [name, descriptor] of saved) {
      if (descriptor) Object.defineProperty(globalThis, name, descriptor)
      else delete (globalThis as Record<string, unknown>)[name]
    }
  }
  expect(touched).toEqual([])
})

it('on a server (no window) falls back to memory with one warning and attaches no listeners', async () => {
  const warn = vi.spyOn(console, 'warn').mockImplementation(() => {})
  const { createClient } = await import('../src/index.js')
  const client = createClient({ baseUrl: 'http://api.test' })
  expect(warn).toHaveBeenCalledTimes(1)
  expect(String(warn.mock.calls[0]![0])).toContain('memory')
  expect(await client.pending()).toEqual([])
  await client.close()
})
