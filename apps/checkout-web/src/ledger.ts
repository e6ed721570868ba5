import type { Ledger } from '@oncely/payments-api/src/routes/ledger-response.ts'
import { useEffect, useState } from 'react'

export type { Ledger }

const EVERY_MS = 1_000

/**
 * The tenant's ledger, read from the API every second while the page is visible: a plain GET with the real
 * `fetch` (never the flaky one), so it shows what the server committed even while the page never sees the answers.
 */
export function useLedger(tenant: string): Ledger | undefined {
  const [ledger, setLedger] = useState<Ledger>()
  useEffect(() => {
    let stopped = false
    const load = async () => {
      if (document.visibilityState !== 'visible') return
      try {
        const response = await fetch('/v1/ledger', { headers: { authorization: `Bearer ${tenant}` } })
        if (response.ok && !stopped) setLedger((await response.json()) as Ledger)
      } catch {
        // The next tick tries again.
      }
    }
    void load()
    const timer = setInterval(load, EVERY_MS)
    return () => {
      stopped = true
      clearInterval(timer)
    }
  }, [tenant])
  return ledger
}
