import { gzipSync } from 'node:zlib'
import { build } from 'esbuild'
import { expect, it } from 'vitest'

const BUDGET = 12.5 * 1024
const root = new URL('..', import.meta.url).pathname

async function bundle(contents: string, platform: 'browser' | 'node' | 'neutral') {
  const result = await build({
    stdin: { contents, resolveDir: root, loader: 'ts' },
    bundle: true,
    minify: true,
    format: 'esm',
    platform,
    target: 'es2022',
    conditions: ['@oncely/source'],
    external: ['node:*'],
    write: false,
    metafile: true,
    logLevel: 'silent',
  })
  return { code: result.outputFiles[0]!.contents, inputs: Object.keys(result.metafile.inputs) }
}

it('the browser entry (index + IndexedDB store) with its dependencies is at most 12.5 KB minified and gzipped', async () => {
  const { code } = await bundle(
    "export * from './src/index.browser.ts'\nexport { indexedDbStore } from './src/stores/idb.ts'",
    'browser',
  )
  const gzipped = gzipSync(code, { level: 9 }).length
  console.log(`browser bundle: ${code.length} bytes minified, ${gzipped} bytes gzipped (budget ${BUDGET})`)
  expect(gzipped).toBeLessThanOrEqual(BUDGET)
})

// Regression: the main entry imported the IndexedDB store through its default-store module, so every Node and
// React Native bundle carried it.
it.each([
  ['the main entry', "export * from './src/index.ts'", 'node'],
  [
    'the main entry with fileStore',
    "export * from './src/index.ts'\nexport * from './src/stores/node.ts'",
    'node',
  ],
  [
    'the main entry with asyncStorageStore',
    "export * from './src/index.ts'\nexport * from './src/stores/async-storage.ts'",
    'neutral',
  ],
] as const)('%s outside browsers does not include the IndexedDB store', async (_, contents, platform) => {
  const { inputs } = await bundle(contents, platform)
  expect(inputs.filter((input) => /idb|indexeddb/i.test(input))).toEqual([])
})

// OpenTelemetry is an optional peer: only `@oncely/client/otel` imports it, never a main entry or a store.
it.each([
  ['the main entry', "export * from './src/index.ts'", 'node'],
  ['the browser entry', "export * from './src/index.browser.ts'", 'browser'],
  ['the stores', "export * from './src/stores/idb.ts'\nexport * from './src/stores/node.ts'", 'node'],
] as const)('%s loads nothing of @opentelemetry', async (_name, contents, platform) => {
  const { inputs } = await bundle(contents, platform)
  expect(inputs.some((input) => input.includes('@opentelemetry'))).toBe(false)
})

it('the otel entry does load @opentelemetry/api (so the check above can fail)', async () => {
  const { inputs } = await bundle("export * from './src/otel/index.ts'", 'neutral')
  expect(inputs.some((input) => input.includes('@opentelemetry/api'))).toBe(true)
})

// @oncely/client/ky costs only what an app that uses it imports: ky itself is the app's (a type here, never
// bundled), and what the entry adds to the browser entry is measured against a budget of its own.
const KY_BUDGET = 2 * 1024
it('the ky entry adds at most 2 KB (minified and gzipped) to the browser entry, and bundles nothing of ky', async () => {
  const browser =
    "export * from './src/index.browser.ts'\nexport { indexedDbStore } from './src/stores/idb.ts'"
  const without = await bundle(browser, 'browser')
  const withKy = await bundle(`${browser}\nexport * from './src/ky/index.ts'`, 'browser')
  const added = gzipSync(withKy.code, { level: 9 }).length - gzipSync(without.code, { level: 9 }).length
  console.log(`ky entry: adds ${added} bytes gzipped to the browser entry (budget ${KY_BUDGET})`)
  expect(added).toBeLessThanOrEqual(KY_BUDGET)
  expect(withKy.inputs.filter((input) => input.includes('src/ky/'))).not.toEqual([])
  expect(withKy.inputs.filter((input) => /node_modules\/(\.pnpm\/)?ky[@/]/.test(input))).toEqual([])
})

it.each([
  ['the main entry', "export * from './src/index.ts'", 'node'],
  ['the browser entry', "export * from './src/index.browser.ts'", 'browser'],
] as const)('%s loads nothing of the ky integration', async (_name, contents, platform) => {
  const { inputs } = await bundle(contents, platform)
  expect(inputs.filter((input) => /(^|\/)ky(\/|@)/.test(input))).toEqual([])
})
