import { gzipSync } from 'node:zlib'
import { build } from 'esbuild'
import { expect, it } from 'vitest'

const BUDGET = 12 * 1024

it('the browser entry (index + IndexedDB store) with its dependencies is at most 12 KB minified and gzipped', async () => {
  const result = await build({
    stdin: {
      contents: "export * from './src/index.ts'\nexport { indexedDbStore } from './src/stores/idb.ts'",
      resolveDir: new URL('..', import.meta.url).pathname,
      loader: 'ts',
    },
    bundle: true,
    minify: true,
    format: 'esm',
    platform: 'browser',
    target: 'es2022',
    conditions: ['@oncely/source'],
    write: false,
    logLevel: 'silent',
  })
  const code = result.outputFiles[0]!.contents
  const gzipped = gzipSync(code, { level: 9 }).length
  console.log(`browser bundle: ${code.length} bytes minified, ${gzipped} bytes gzipped (budget ${BUDGET})`)
  expect(gzipped).toBeLessThanOrEqual(BUDGET)
})
