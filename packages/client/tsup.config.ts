import { defineConfig, type Options } from 'tsup'

const entry = {
  index: 'src/index.ts',
  // The main entry as browsers resolve it (the `browser` export condition): createClient defaults to IndexedDB.
  'index.browser': 'src/index.browser.ts',
  idb: 'src/stores/idb.ts',
  node: 'src/stores/node.ts',
  'react-native': 'src/stores/async-storage.ts',
  // OpenTelemetry (the optional peer @opentelemetry/api stays external).
  otel: 'src/otel/index.ts',
  // ky (the optional peer ky, a type only: nothing of it is imported at run time).
  ky: 'src/ky/index.ts',
}

const common: Options = {
  entry,
  dts: true,
  sourcemap: true,
  target: 'es2022',
  // Workspace siblings are bundled so the published package does not depend on their build layout.
  noExternal: ['@oncely/protocol'],
}

export default defineConfig([
  { ...common, format: ['esm'], platform: 'neutral' },
  // is-network-error ships ESM only; bundling it into the CJS build lets
  // require('@oncely/client') work.
  {
    ...common,
    format: ['cjs'],
    platform: 'neutral',
    noExternal: ['@oncely/protocol', 'is-network-error'],
  },
])
