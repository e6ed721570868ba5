/**
 * The checkout page: one client for the page, created once (never during a render), with the IndexedDB store and a
 * switch that drops every response after the server committed. `OncelyProvider` resumes what an earlier page left
 * pending once the page has mounted.
 */
import { createClient } from '@oncely/client'
import { indexedDbStore } from '@oncely/client/idb'
import { OncelyProvider } from '@oncely/react'
import { StrictMode } from 'react'
import { createRoot } from 'react-dom/client'
import { App } from './app.js'
import { type FlakySwitch, flakyFetch } from './flaky-fetch.js'
import { demoTenant } from './tenant.js'
import './style.css'

const tenant = demoTenant(localStorage)
// Off at every page load, like the checkbox that drives it.
const flaky: FlakySwitch = { on: false }

const client = createClient({
  baseUrl: window.location.origin,
  store: indexedDbStore({ name: 'oncely-checkout-demo' }),
  // The demo API's stand-in for authentication: the bearer token is the tenant id.
  headers: () => ({ authorization: `Bearer ${tenant}` }),
  fetch: flakyFetch(flaky),
  retry: { minDelayMs: 500, maxDelayMs: 4_000 },
  timeoutMs: 15_000,
})

createRoot(document.getElementById('root') as HTMLElement).render(
  <StrictMode>
    <OncelyProvider client={client}>
      <App client={client} tenant={tenant} flaky={flaky} />
    </OncelyProvider>
  </StrictMode>,
)
