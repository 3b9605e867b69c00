-- Argo CD health check for posttrain.dev/RLJob and posttrain.dev/SFTJob: one script, installed under both
-- kinds' keys in argocd-cm (Lua 5.1, as Argo CD runs it; `obj` is the resource).
-- Progressing: no status yet, Pending, Verifying, Queued (waiting for Kueue), Provisioning, Running (or a
--              generation not yet observed)
-- Healthy:     Succeeded (message: the fine-tuned model id)
-- Degraded:    Failed (message: status.message, else the Failed condition's message, else the reason)
-- Suspended:   phase Suspended, or spec.suspend set on a job that has not finished
-- Unknown:     a phase this script does not know
-- Tested by tests/unit/test_argocd_health.py (lupa) and judged by a real Argo CD in tests/e2e/test_gitops_argocd.py.
local hs = {}

local function condition(status, ctype)
  if status == nil or status.conditions == nil then
    return nil
  end
  for _, c in ipairs(status.conditions) do
    if c.type == ctype then
      return c
    end
  end
  return nil
end

local function failure_message(status)
  if status.message ~= nil and status.message ~= "" then
    return status.message
  end
  local failed = condition(status, "Failed")
  if failed ~= nil and failed.message ~= nil and failed.message ~= "" then
    return failed.message
  end
  if status.reason ~= nil and status.reason ~= "" then
    return status.reason
  end
  if failed ~= nil and failed.reason ~= nil and failed.reason ~= "" then
    return failed.reason
  end
  return "job failed"
end

local function progress_message(phase, status)
  local msg = phase
  local p = status.progress
  if p ~= nil and p.step ~= nil then
    if p.total ~= nil then
      msg = msg .. string.format(": step %s/%s", tostring(p.step), tostring(p.total))
    else
      msg = msg .. string.format(": step %s", tostring(p.step))
    end
    if p.meanReturn ~= nil then
      msg = msg .. string.format(", mean return %s", tostring(p.meanReturn))
    end
    if p.loss ~= nil then
      msg = msg .. string.format(", loss %s", tostring(p.loss))
    end
  elseif status.message ~= nil and status.message ~= "" then
    msg = msg .. ": " .. status.message
  end
  return msg
end

local status = obj.status or {}
local phase = status.phase
local suspend = obj.spec ~= nil and obj.spec.suspend == true

-- Terminal phases first: a finished job stays finished whatever spec.suspend says.
local complete = condition(status, "Complete") or condition(status, "Succeeded")
if phase == "Succeeded" or (phase == nil and complete ~= nil and complete.status == "True") then
  hs.status = "Healthy"
  local model = status.fineTunedModel
  if model == nil and status.result ~= nil then
    model = status.result.fineTunedModel
  end
  if model ~= nil and model ~= "" then
    hs.message = "Succeeded: " .. model
  else
    hs.message = "Succeeded"
  end
  return hs
end

local failed = condition(status, "Failed")
if phase == "Failed" or (phase == nil and failed ~= nil and failed.status == "True") then
  hs.status = "Degraded"
  hs.message = failure_message(status)
  return hs
end

if phase == "Suspended" or suspend then
  hs.status = "Suspended"
  if status.message ~= nil and status.message ~= "" then
    hs.message = status.message
  else
    hs.message = "Suspended (spec.suspend is true)"
  end
  return hs
end

if phase == nil or phase == "" then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to pick up the job"
  return hs
end

if phase == "Pending" or phase == "Verifying" or phase == "Queued" or phase == "Provisioning" or phase == "Running" then
  hs.status = "Progressing"
  local generation = obj.metadata ~= nil and obj.metadata.generation or nil
  if generation ~= nil and status.observedGeneration ~= nil and status.observedGeneration < generation then
    hs.message = string.format("%s (operator has not observed generation %s yet)", phase, tostring(generation))
  else
    hs.message = progress_message(phase, status)
  end
  return hs
end

hs.status = "Unknown"
hs.message = "Unknown phase: " .. tostring(phase)
return hs
