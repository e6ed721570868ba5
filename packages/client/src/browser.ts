/**
 * In a browser, calls `onChance` when the connection comes back or the page becomes visible again (when a background
 * tab may have missed its chance). Attached when a client is created, never at import; returns the remover.
 */
export function watchConnectivity(onChance: () => void): () => void {
  const win = typeof window === 'undefined' ? undefined : window
  const doc = typeof document === 'undefined' ? undefined : document
  if (!win?.addEventListener) return () => {}
  const onVisible = () => {
    if (doc?.visibilityState === 'visible') onChance()
  }
  win.addEventListener('online', onChance)
  doc?.addEventListener('visibilitychange', onVisible)
  return () => {
    win.removeEventListener('online', onChance)
    doc?.removeEventListener('visibilitychange', onVisible)
  }
}
