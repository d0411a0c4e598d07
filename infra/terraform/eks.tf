# EKS with the community module's v21 conventions (name / kubernetes_version /
# addons, EKS Pod Identity instead of static keys) and three managed node groups.
locals {
  # Labels the Prefect work pools and the RayCluster select on (infra/k8s).
  node_pool_label = "arl.dev/node-pool"
}

module "eks" {
  # checkov:skip=CKV_TF_1:Registry module pinned to a major version (a commit hash applies to git sources only); .terraform.lock.hcl pins providers.
  source  = "terraform-aws-modules/eks/aws"
  version = "~> 21.0"

  name               = var.cluster_name
  kubernetes_version = var.kubernetes_version

  endpoint_public_access       = true
  endpoint_public_access_cidrs = var.endpoint_public_access_cidrs

  # The identity that runs `terraform apply` becomes cluster admin (access entry).
  enable_cluster_creator_admin_permissions = true
  enabled_log_types                        = ["api", "audit", "authenticator"]

  addons = {
    coredns                = {}
    kube-proxy             = {}
    vpc-cni                = { before_compute = true }
    eks-pod-identity-agent = { before_compute = true }
  }

  vpc_id     = module.vpc.vpc_id
  subnet_ids = module.vpc.private_subnets

  eks_managed_node_groups = {
    system = {
      ami_type       = "AL2023_x86_64_STANDARD"
      instance_types = var.system_instance_types
      min_size       = var.system_min_size
      max_size       = var.system_max_size
      desired_size   = var.system_desired_size
      labels         = { (local.node_pool_label) = "system" }
    }

    gpu-a100 = {
      # NVIDIA driver and container toolkit come with the AMI; the device
      # plugin (infra/k8s/nvidia-device-plugin.yaml) advertises nvidia.com/gpu.
      ami_type       = "AL2023_x86_64_NVIDIA"
      instance_types = var.gpu_instance_types
      capacity_type  = var.gpu_capacity_type
      min_size       = var.gpu_min_size
      max_size       = var.gpu_max_size
      desired_size   = var.gpu_desired_size

      labels = {
        (local.node_pool_label) = "gpu-a100"
        "arl.dev/accelerator"   = "nvidia-a100"
      }
      # Only pods that tolerate this taint (the GPU work pool) land here.
      taints = {
        gpu = {
          key    = "nvidia.com/gpu"
          value  = "true"
          effect = "NO_SCHEDULE"
        }
      }
      block_device_mappings = {
        xvda = {
          device_name = "/dev/xvda"
          ebs = {
            volume_size           = 500
            volume_type           = "gp3"
            encrypted             = true
            delete_on_termination = true
          }
        }
      }
    }

    cpu-epyc = {
      ami_type       = "AL2023_x86_64_STANDARD"
      instance_types = var.cpu_instance_types
      min_size       = var.cpu_min_size
      max_size       = var.cpu_max_size
      desired_size   = var.cpu_desired_size
      labels = {
        (local.node_pool_label) = "cpu-epyc"
        "arl.dev/cpu-vendor"    = "amd-epyc"
      }
    }
  }
}
