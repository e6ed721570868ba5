import { defaultClientConditions, defineConfig } from 'vite'

// Workspace packages resolve to their `src` (the `@oncely/source` export condition), so the page builds from a
// fresh clone without building @oncely/client first, and never bundles a stale dist.
export default defineConfig({
  resolve: { conditions: ['@oncely/source', ...defaultClientConditions] },
  build: { outDir: 'dist', emptyOutDir: true, sourcemap: true },
})
