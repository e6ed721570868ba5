const TENANT_KEY = 'oncely-demo:tenant'

/**
 * This browser's demo tenant, `demo-<random>`, kept in `storage` so a reload keeps it: the ledger panel then shows
 * this visitor's payments and charges only, starting from zero, even on a long-lived demo database.
 */
export function demoTenant(storage: Storage): string {
  let tenant = storage.getItem(TENANT_KEY)
  if (!tenant || !/^demo-[a-z0-9]{8}$/.test(tenant)) {
    const bytes = crypto.getRandomValues(new Uint8Array(8))
    tenant = `demo-${Array.from(bytes, (byte) => (byte % 36).toString(36)).join('')}`
    storage.setItem(TENANT_KEY, tenant)
  }
  return tenant
}
