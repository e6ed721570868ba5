import { defineConfig } from 'tsup'

// React and @oncely/client stay external: the app's own copies must be used (one React, one client).
export default defineConfig({
  entry: { index: 'src/index.ts' },
  format: ['esm', 'cjs'],
  dts: true,
  sourcemap: true,
  target: 'es2022',
  platform: 'neutral',
})
