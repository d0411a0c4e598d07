variable "cluster_name" {
  description = "Name of the EKS cluster; also the prefix of every other resource name."
  type        = string
  default     = "arl"
}

variable "region" {
  description = "AWS region. A100 (p4d) capacity exists in a few regions only, e.g. us-east-1, us-west-2."
  type        = string
  default     = "us-east-1"
}

variable "kubernetes_version" {
  description = "EKS Kubernetes minor version."
  type        = string
  default     = "1.33"
}

variable "az_suffixes" {
  description = "Availability zones (suffixes of the region) to spread subnets over; p4d capacity differs per zone, check with `aws ec2 describe-instance-type-offerings --location-type availability-zone`."
  type        = list(string)
  default     = ["a", "b", "c"]
}

variable "vpc_cidr" {
  description = "CIDR block of the VPC created for the cluster."
  type        = string
  default     = "10.42.0.0/16"
}

variable "endpoint_public_access_cidrs" {
  description = "CIDRs allowed to reach the public Kubernetes API endpoint (your workstation or VPN egress, e.g. [\"203.0.113.7/32\"]). No default: you must choose."
  type        = list(string)
}

variable "namespace" {
  description = "Kubernetes namespace the Prefect server, workers, MLflow and flow-run pods live in."
  type        = string
  default     = "arl"
}

variable "flow_runner_service_account" {
  description = "Service account used by flow-run pods and Ray workers; it is given S3 access to both buckets through EKS Pod Identity."
  type        = string
  default     = "arl-flow-runner"
}

variable "mlflow_service_account" {
  description = "Service account of the MLflow tracking server; it is given S3 access to the MLflow artifact bucket."
  type        = string
  default     = "mlflow"
}

variable "gpu_instance_types" {
  description = "A100 instance types for the gpu-a100 node group (p4d.24xlarge: 8x A100 40 GB; p4de.24xlarge: 8x A100 80 GB)."
  type        = list(string)
  default     = ["p4d.24xlarge"]
}

variable "gpu_capacity_type" {
  description = "ON_DEMAND or SPOT for the GPU node group."
  type        = string
  default     = "ON_DEMAND"
}

variable "gpu_min_size" {
  description = "Minimum number of A100 nodes. 0 lets the group scale to zero when no training runs."
  type        = number
  default     = 0
}

variable "gpu_max_size" {
  description = "Maximum number of A100 nodes."
  type        = number
  default     = 2
}

variable "gpu_desired_size" {
  description = "Initial number of A100 nodes (ignored by the module after creation)."
  type        = number
  default     = 0
}

variable "cpu_instance_types" {
  description = "AMD EPYC instance types for the cpu-epyc node group (the trailing 'a' marks AMD)."
  type        = list(string)
  default     = ["c6a.8xlarge", "c7a.8xlarge", "m6a.8xlarge"]
}

variable "cpu_min_size" {
  description = "Minimum number of EPYC nodes."
  type        = number
  default     = 0
}

variable "cpu_max_size" {
  description = "Maximum number of EPYC nodes."
  type        = number
  default     = 8
}

variable "cpu_desired_size" {
  description = "Initial number of EPYC nodes (ignored by the module after creation)."
  type        = number
  default     = 1
}

variable "system_instance_types" {
  description = "Instance types of the small system group (CoreDNS, Prefect server and workers, MLflow, KubeRay operator)."
  type        = list(string)
  default     = ["m6a.large"]
}

variable "system_min_size" {
  description = "Minimum number of system nodes."
  type        = number
  default     = 2
}

variable "system_max_size" {
  description = "Maximum number of system nodes."
  type        = number
  default     = 3
}

variable "system_desired_size" {
  description = "Initial number of system nodes."
  type        = number
  default     = 2
}

variable "dvc_bucket_name" {
  description = "Globally unique name of the S3 bucket used as the DVC remote."
  type        = string
}

variable "mlflow_bucket_name" {
  description = "Globally unique name of the S3 bucket holding MLflow artifacts."
  type        = string
}

variable "db_instance_class" {
  description = "RDS instance class of the PostgreSQL server that holds the prefect and mlflow databases."
  type        = string
  default     = "db.t4g.medium"
}

variable "db_allocated_storage" {
  description = "Allocated storage of the PostgreSQL server, in GiB."
  type        = number
  default     = 50
}

variable "db_engine_version" {
  description = "PostgreSQL major version."
  type        = string
  default     = "16"
}

variable "db_multi_az" {
  description = "Run a standby PostgreSQL in a second availability zone (doubles the database cost)."
  type        = bool
  default     = false
}

variable "db_deletion_protection" {
  description = "Refuse to delete the database; set false before `terraform destroy`."
  type        = bool
  default     = true
}

variable "tags" {
  description = "Extra tags applied to every resource."
  type        = map(string)
  default     = {}
}
